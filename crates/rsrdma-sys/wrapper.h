/* The headers rsrdma-sys binds. `cargo xtask regen-bindings` feeds this file to bindgen. */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
