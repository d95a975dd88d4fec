//! The device tests that run on the host against the software device `soft0` (no root, no
//! VM): the same sources as the VM's run against rxe0, with `RSRDMA_TEST_DEVICE=soft0`. Each
//! test is named: a test missing from a list runs only in the VM, for one of these reasons
//! (what `soft0` does not do yet): rdma_cm (every `*_over_rdma_cm` test and most tests that
//! use the default establishment), peers in another process (child-process tests, peer death
//! by signal), UD and UC queue pairs and address handles (`PacketConn`, `ud_*`, `uc_*`),
//! memory windows, and comparisons with `ibv_devinfo` and sysfs.

/// (package, test target, tests run on `soft0`).
pub(crate) const SOFT_TESTS: &[(&str, &str, &[&str])] = &[
    (
        "rsrdma",
        "device",
        &[
            "data::atomics_compare_swap_and_fetch_add",
            "data::batch_of_64_in_one_post_with_every_16th_signaled",
            "data::batch_post_reports_which_request_failed",
            "data::immediate_data_reaches_the_receiver",
            "data::inline_sends_need_no_registration_and_respect_the_limit",
            "data::memory_without_remote_write_refuses_writes",
            "data::out_of_bounds_remote_address_ends_in_remote_access_error",
            "data::qp_moved_to_error_flushes_its_requests",
            "data::rc_send_recv_at_edge_sizes",
            "data::rdma_write_and_read_move_bytes_exactly",
            "data::transitions_are_checked_and_queryable",
            "data::unsignaled_sends_with_every_nth_signaled",
            "data::wrong_rkey_ends_in_remote_access_error",
            "drops::children_keep_their_parents_alive",
            "events::a_shared_channel_routes_each_event_to_its_cq",
            "events::completion_channel_wakes_a_blocked_waiter",
            "events::srq_limit_and_last_wqe_events_name_their_objects",
            "events::try_event_takes_a_ready_event_without_blocking",
            "events::waiting_without_a_channel_is_an_error",
            "queries::limits_are_checked_before_any_verb",
            "queries::the_default_gid_is_the_routable_ipv4_one",
            "queries::the_inline_limit_is_public_and_exact",
            "soundness::a_deregistered_region_is_never_written",
            "soundness::impossible_region_sizes_are_errors",
            "soundness::remotely_writable_regions_give_copies_not_references",
            "soundness::two_threads_post_and_poll_one_queue_pair",
            "ud_srq::srq_feeds_several_queue_pairs",
            "windows::a_refused_deregistration_hands_the_region_back",
            "windows::a_window_never_grants_write_to_a_region_that_hands_out_safe_slices",
            "windows::a_window_serves_reads_through_its_qp_only_and_not_after_its_invalidation",
        ],
    ),
    (
        "rsrdma-net",
        "device",
        &[
            "a_receiver_notices_a_dead_sender_within_seconds",
            "authentication_and_bad_peers",
            "barriers_and_settled_options",
            "event_mode_receive_wakes_through_the_channel",
            "mismatched_parameters_fail_on_both_ends",
            "one_sided_write_and_read_byte_for_byte",
            "send_pipelines_per_wr_and_batched_against_recv_drain",
            "shared_pd_two_connections_one_mr",
        ],
    ),
    (
        "rsrdma-net",
        "conn_device",
        &[
            "a_byte_stream_with_io_copy",
            "a_flood_of_silent_and_garbage_sockets_delays_no_good_client",
            "a_qp_forced_to_error_fails_both_sides_promptly",
            "a_timeout_inside_a_message_keeps_it_whole_on_both_sides",
            "echo_0_bytes_to_3_mib_over_tcp_handshake",
            "every_message_send_msg_accepted_arrives_and_no_timed_out_one_does",
            "short_buffer_keeps_the_message_and_the_cap_is_enforced",
        ],
    ),
    (
        "rsrdma-net",
        "zerocopy_device",
        &[
            "zerocopy_both_ways_around_the_threshold_over_tcp_handshake",
            "zerocopy_eager_send_buffer_copies_nothing_over_tcp_handshake",
            "zerocopy_pool_shared_by_connections_on_one_pd",
            "zerocopy_stream_reads_get_rendezvous_messages_whole",
        ],
    ),
    (
        "rsrdma-net",
        "async_device",
        &[
            "framed_with_a_length_delimited_codec",
            "half_close_lets_the_peer_answer",
            "one_async_accept_loop_serves_a_good_client_through_a_flood",
        ],
    ),
    (
        "rsrdma-net",
        "shared_recv_device",
        &[
            "shared_recv_few_connections_both_ways_over_tcp_handshake",
            "shared_recv_is_a_listener_option",
            "shared_recv_pool_smaller_than_credits_delivers_everything_over_tcp_handshake",
            "shared_recv_rendezvous_is_only_through_windows",
        ],
    ),
];
