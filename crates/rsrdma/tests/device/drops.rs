//! Every object dropped in every order: no crash, no hang, and nothing left behind (file
//! descriptors and this process's kernel resources on the device come back to where they
//! were).

use crate::common::{ctx, device_name};
use rsrdma::{AccessFlags, Ah, AhAttr, CompChannel, Cq, GlobalRoute, Mr, Pd, Qp, QpType, Srq};
use std::any::Any;
use std::collections::BTreeMap;

/// The kinds of kernel resource `rdma resource show` lists.
const KINDS: [&str; 7] = ["cm_id", "cq", "ctx", "mr", "pd", "qp", "srq"];

/// This thread's kernel resources on the device under test, per kind, from `rdma -j
/// resource show KIND` (only those whose `pid` is this thread's: the kernel names the task
/// that made each, and the VM runs other test binaries beside this one, whose objects come
/// and go meanwhile).
fn resource_counts() -> BTreeMap<String, u64> {
    let dev = format!("\"ifname\":\"{}\"", device_name());
    // SAFETY: gettid has no preconditions.
    let pid = unsafe { libc::gettid() };
    let mine = |chunk: &str| {
        chunk.contains(&dev)
            && [",", "}"]
                .iter()
                .any(|end| chunk.contains(&format!("\"pid\":{pid}{end}")))
    };
    KINDS
        .iter()
        .map(|kind| {
            let out = std::process::Command::new("rdma")
                .args(["-j", "resource", "show", kind])
                .output()
                .expect("run rdma");
            assert!(out.status.success(), "rdma -j resource show {kind}");
            let text = String::from_utf8(out.stdout).unwrap();
            let n = text.split("},{").filter(|c| mine(c)).count() as u64;
            (kind.to_string(), n)
        })
        .collect()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// One of each object, connected the way users connect them, as type-erased boxes so they can
/// be dropped in any order.
fn make_all() -> Vec<(&'static str, Box<dyn Any>)> {
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    let ch = CompChannel::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, 8, Some(&ch)).unwrap();
    cq.arm(false).unwrap();
    let srq = Srq::new(&pd, 8, 1).unwrap();
    let qp = Qp::builder(QpType::Rc)
        .srq(&srq)
        .build(&pd, &cq, &cq)
        .unwrap();
    let mr = Mr::new(&pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let gid = ctx
        .query_gid(1, crate::common::gid_index().into())
        .unwrap()
        .gid;
    let ah = Ah::new(
        &pd,
        &AhAttr {
            port_num: 1,
            grh: Some(GlobalRoute::new(gid, crate::common::gid_index())),
            ..Default::default()
        },
    )
    .unwrap();
    vec![
        ("ctx", Box::new(ctx)),
        ("pd", Box::new(pd)),
        ("channel", Box::new(ch)),
        ("cq", Box::new(cq)),
        ("srq", Box::new(srq)),
        ("qp", Box::new(qp)),
        ("mr", Box::new(mr)),
        ("ah", Box::new(ah)),
    ]
}

/// All permutations of 0..n (Heap's algorithm).
fn permutations(n: usize) -> Vec<Vec<usize>> {
    fn heap(k: usize, a: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if k == 1 {
            out.push(a.clone());
            return;
        }
        for i in 0..k {
            heap(k - 1, a, out);
            let j = if k % 2 == 0 { i } else { 0 };
            a.swap(j, k - 1);
        }
    }
    let mut a: Vec<usize> = (0..n).collect();
    let mut out = Vec::new();
    heap(n, &mut a, &mut out);
    out
}

#[test]
fn every_drop_order_is_safe_and_leaks_nothing() {
    // Warm up: libibverbs keeps some per-process state (the device list, provider libraries)
    // after the first open; measure after it exists.
    drop(make_all());
    let fds = open_fds();
    let counts = resource_counts();
    // The counts see this process's objects (else the comparison below proves nothing).
    let held = make_all();
    let with = resource_counts();
    for kind in ["ctx", "pd", "cq", "qp", "mr"] {
        assert!(
            with[kind] > counts[kind],
            "{kind}: {counts:?} then {with:?}"
        );
    }
    drop(held);

    // All 120 orders of the five core objects, with the other three dropped first…
    let core = ["ctx", "pd", "cq", "qp", "mr"];
    for order in permutations(core.len()) {
        let mut objs = make_all();
        objs.retain(|(name, _)| core.contains(name));
        let mut slots: Vec<Option<Box<dyn Any>>> = core
            .iter()
            .map(|n| {
                Some(
                    objs.iter()
                        .position(|(m, _)| m == n)
                        .map(|i| objs.remove(i).1)
                        .unwrap(),
                )
            })
            .collect();
        for i in order {
            drop(slots[i].take());
        }
    }
    // …and a spread of orders over all eight (every 97th of the 40320).
    for (k, order) in permutations(8).into_iter().enumerate() {
        if k % 97 != 0 {
            continue;
        }
        let mut objs: Vec<Option<(&str, Box<dyn Any>)>> =
            make_all().into_iter().map(Some).collect();
        for i in order {
            drop(objs[i].take());
        }
    }
    assert_eq!(open_fds(), fds, "file descriptors leaked");
    assert_eq!(
        resource_counts(),
        counts,
        "verbs objects leaked (rdma resource show)"
    );
}

#[test]
fn children_keep_their_parents_alive() {
    // Drop every handle but the QP: the QP still works, because it holds its PD, CQs and
    // context. Then the MR, held separately, still describes live memory.
    let (qp, cq) = {
        let ctx = ctx();
        let pd = Pd::new(&ctx).unwrap();
        let cq = Cq::new(&ctx, 8, None).unwrap();
        let qp = Qp::builder(QpType::Rc).build(&pd, &cq, &cq).unwrap();
        (qp, cq)
    };
    let mr = Mr::new(qp.pd(), 64, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(qp.pd().context().name(), device_name());
    let opts = crate::common::connect_opts(AccessFlags::NONE);
    let e = qp.endpoint(1, Some(crate::common::gid_index()), 1).unwrap();
    qp.connect(&opts, 1, &e).unwrap(); // connected to itself
    let sge = [mr.sge(0, 8).unwrap()];
    // SAFETY: `mr` outlives the completions polled below.
    unsafe {
        qp.post_recv(&rsrdma::RecvWr::new(1, &sge)).unwrap();
        qp.post_send(&rsrdma::SendWr::send(2, &sge)).unwrap();
    }
    let wcs = crate::common::poll_n(&cq, 2);
    assert!(wcs.iter().all(|w| w.is_ok()), "{wcs:?}");
    drop(cq);
    drop(qp);
    drop(mr);
}
