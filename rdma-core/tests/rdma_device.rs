//! RDMA tier: the device works from Rust through rdmashim's own bindings.
//!
//! Runs only in the VM tier (`#[ignore]` here; `scripts/test` runs it inside `scripts/rdma-vm`
//! with `--ignored`). See tests/support/mod.rs.

mod support;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use rdmashim_core::cm::{event_type as ev, CmId, ConnParam, EventChannel, QpCaps};
use rdmashim_core::sys::ffi;
use rdmashim_core::verbs::{Access, CompChannel, Context, Cq, Pd, RegisteredBuf};

const T: Duration = Duration::from_secs(20);

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn device_opens_with_an_active_port_and_a_gid() {
    let name = support::device();
    let names = rdmashim_core::verbs::device_names().expect("ibv_get_device_list");
    assert!(names.contains(&name), "{name} not in {names:?}");

    let ctx = Context::open(&name).expect("ibv_open_device");
    assert_eq!(ctx.name(), name);
    let attr = ctx.query_device().expect("ibv_query_device");
    assert!(attr.phys_port_cnt >= 1);
    assert!(attr.max_qp > 0 && attr.max_cqe > 0 && attr.max_mr_size > 0);

    let port = ctx.query_port(1).expect("ibv_query_port");
    assert_eq!(
        port.state,
        ffi::ibv_port_state::IBV_PORT_ACTIVE,
        "port 1 not active"
    );
    assert_eq!(port.link_layer, 2, "soft-RoCE is an Ethernet link layer");
    assert!(port.gid_tbl_len > 0);

    // RoCE v2 GIDs of an IPv4 address are IPv4-mapped IPv6 (::ffff:a.b.c.d): find ours.
    let ip = match support::ip() {
        std::net::IpAddr::V4(v4) => v4.octets(),
        std::net::IpAddr::V6(_) => panic!("the VM tier uses an IPv4 address"),
    };
    let found = (0..port.gid_tbl_len)
        .filter_map(|i| ctx.query_gid(1, i).ok())
        .any(|g| g[10] == 0xff && g[11] == 0xff && g[12..] == ip);
    assert!(found, "no GID of {name} carries the address {ip:?}");

    let devs = rdmashim_core::probe::probe().expect("probe finds the device");
    let d = devs
        .iter()
        .find(|d| d.name == name)
        .expect("probe lists the device");
    assert!(d
        .ports
        .iter()
        .any(|p| p.active && p.link_layer == "Ethernet" && p.mtu >= 1024));
}

#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn memory_registers_with_ring_rights_and_deregisters() {
    let ctx = Context::open(&support::device()).expect("open");
    let pd = Pd::new(&ctx).expect("ibv_alloc_pd");
    let mut bufs = Vec::new();
    for len in [1usize, 4096, 1 << 20] {
        let mut b = RegisteredBuf::new(&pd, len, Access::RING).expect("ibv_reg_mr");
        assert!(b.len() >= len && b.len().is_multiple_of(4096));
        assert_eq!(b.mr().len(), b.len());
        assert_ne!(b.mr().lkey(), 0);
        b.as_mut_slice()[len - 1] = 0xa5;
        bufs.push(b);
    }
    let rkeys: std::collections::HashSet<u32> = bufs.iter().map(|b| b.mr().rkey()).collect();
    assert_eq!(
        rkeys.len(),
        bufs.len(),
        "every registration has its own rkey"
    );
    // A range outside the registration is refused before it reaches the device.
    assert!(bufs[1].mr().sge(4000, 200).is_err());
    assert!(bufs[1].mr().sge(0, 4096).is_ok());
    drop(bufs); // deregisters, then unmaps: must not crash
    drop(pd);
}

/// What the server tells the client in its accept private_data: where to write.
fn encode_ring(addr: u64, rkey: u32, len: u32) -> Vec<u8> {
    let mut v = b"RING".to_vec();
    v.extend_from_slice(&addr.to_be_bytes());
    v.extend_from_slice(&rkey.to_be_bytes());
    v.extend_from_slice(&len.to_be_bytes());
    v
}

fn decode_ring(b: &[u8]) -> (u64, u32, u32) {
    assert_eq!(&b[..4], b"RING", "accept private_data lost its tag: {b:?}");
    (
        u64::from_be_bytes(b[4..12].try_into().unwrap()),
        u32::from_be_bytes(b[12..16].try_into().unwrap()),
        u32::from_be_bytes(b[16..20].try_into().unwrap()),
    )
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// rdma_cm connect/accept between two threads over the device's address, private_data carried
/// both ways (the client's request, the server's reply with its buffer's address and rkey),
/// then the client RDMA-WRITEs into the server's memory: a plain WRITE and a WRITE WITH
/// IMMEDIATE whose completion wakes the server through its completion channel. The server
/// checks every byte and the immediate.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn cm_connect_carries_private_data_and_rdma_write_lands() {
    const LEN: usize = 256 * 1024;
    let addr = support::addr(1);
    let request: Vec<u8> = (0u8..56).collect(); // the full 56 bytes a connect request may carry

    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let req_expect = request.clone();
    let server = thread::spawn(move || {
        let ch = EventChannel::new().expect("event channel");
        let listener = CmId::new(&ch).expect("rdma_create_id");
        listener.bind(addr).expect("rdma_bind_addr");
        listener.listen(8).expect("rdma_listen");
        ready_tx.send(()).unwrap();

        let req = ch
            .expect(ev::RDMA_CM_EVENT_CONNECT_REQUEST, "CONNECT_REQUEST", T)
            .expect("connect request");
        assert!(
            req.private_data.len() >= req_expect.len(),
            "private_data shrank to {} bytes",
            req.private_data.len()
        );
        assert_eq!(&req.private_data[..req_expect.len()], &req_expect[..]);
        // SAFETY: a CONNECT_REQUEST from this channel, wrapped once.
        let mut conn = unsafe { CmId::from_request(&ch, &req) }.expect("request id");

        let ctx = conn.context().expect("device of the request");
        let pd = Pd::new(&ctx).unwrap();
        let comp = CompChannel::new(&ctx).unwrap();
        let cq = Cq::new(&ctx, 64, Some(&comp)).unwrap();
        conn.create_qp(&pd, &cq, &cq, QpCaps::default())
            .expect("rdma_create_qp");
        let ring = RegisteredBuf::new(&pd, LEN, Access::RING).unwrap();
        let slot = RegisteredBuf::new(&pd, 4096, Access::LOCAL).unwrap();
        // one receive for the WRITE WITH IMMEDIATE (it consumes a receive, not its buffer)
        conn.post_recvs(&[7], slot.mr(), 0).expect("ibv_post_recv");

        let reply = encode_ring(ring.mr().addr() as u64, ring.mr().rkey(), LEN as u32);
        conn.accept(&ConnParam {
            private_data: &reply,
            ..Default::default()
        })
        .expect("rdma_accept");
        ch.expect(ev::RDMA_CM_EVENT_ESTABLISHED, "ESTABLISHED", T)
            .expect("established (server)");

        // Sleep on the completion channel until the immediate arrives.
        let mut wc = [unsafe_zeroed_wc(); 4];
        let n = cq
            .wait(&mut wc, 20_000)
            .expect("completion of the WRITE WITH IMM");
        assert_eq!(n, 1);
        assert_eq!(wc[0].status, ffi::ibv_wc_status::IBV_WC_SUCCESS);
        assert_eq!(wc[0].opcode, ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM);
        assert_eq!(wc[0].wr_id, 7);
        // SAFETY: the union's imm_data is valid when wc_flags has IBV_WC_WITH_IMM.
        let imm = u32::from_be(unsafe { wc[0].imm_data_invalidated_rkey_union.imm_data });
        assert_ne!(wc[0].wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0, 0);
        assert_eq!(imm, 0xC0FF_EE01);
        assert_eq!(
            wc[0].byte_len as usize,
            LEN / 2,
            "byte_len of a WRITE WITH IMM is its length"
        );

        // First half: plain WRITE (ordered before the WITH_IMM on the same RC QP);
        // second half: the WRITE WITH IMM.
        let got = ring.as_slice();
        assert!(
            got[..LEN / 2] == pattern(LEN / 2, 1)[..],
            "plain RDMA WRITE bytes differ"
        );
        assert!(
            got[LEN / 2..LEN] == pattern(LEN / 2, 2)[..],
            "WRITE WITH IMM bytes differ"
        );

        ch.expect(ev::RDMA_CM_EVENT_DISCONNECTED, "DISCONNECTED", T)
            .expect("client disconnects");
        let keep = (ring, slot, Arc::clone(&pd));
        drop(conn);
        drop(keep);
    });

    ready_rx.recv_timeout(T).expect("server listening");
    let support::RawClient { ch, id, pd, cq } = support::raw_client(addr);
    id.connect(&ConnParam {
        private_data: &request,
        ..Default::default()
    })
    .expect("rdma_connect");
    let est = ch
        .expect(ev::RDMA_CM_EVENT_ESTABLISHED, "ESTABLISHED", T)
        .expect("established (client)");
    let (raddr, rkey, rlen) = decode_ring(&est.private_data);
    assert_eq!(rlen as usize, LEN);

    let mut src = RegisteredBuf::new(&pd, LEN, Access::LOCAL).unwrap();
    src.as_mut_slice()[..LEN / 2].copy_from_slice(&pattern(LEN / 2, 1));
    src.as_mut_slice()[LEN / 2..LEN].copy_from_slice(&pattern(LEN / 2, 2));
    id.post_write(1, src.mr(), 0, LEN / 2, raddr, rkey, None, false)
        .expect("post RDMA WRITE");
    id.post_write(
        2,
        src.mr(),
        LEN / 2,
        LEN / 2,
        raddr + (LEN / 2) as u64,
        rkey,
        Some(0xC0FF_EE01),
        true,
    )
    .expect("post RDMA WRITE WITH IMM");
    let mut wc = [unsafe_zeroed_wc(); 4];
    let n = cq.wait(&mut wc, 20_000).expect("send completion");
    assert_eq!(n, 1);
    assert_eq!(
        wc[0].status,
        ffi::ibv_wc_status::IBV_WC_SUCCESS,
        "send completion failed"
    );
    assert_eq!(wc[0].wr_id, 2);
    assert_eq!(wc[0].opcode, ffi::ibv_wc_opcode::IBV_WC_RDMA_WRITE);

    // A write outside the server's registration must fail on the device, not corrupt memory.
    id.post_write(3, src.mr(), 0, 4096, raddr + LEN as u64, rkey, None, true)
        .expect("post out-of-range WRITE");
    let n = cq.wait(&mut wc, 20_000).expect("error completion");
    assert_eq!(n, 1);
    assert_eq!(wc[0].wr_id, 3);
    assert_eq!(wc[0].status, ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR);

    id.disconnect().expect("rdma_disconnect");
    server.join().expect("server thread");
}

/// A connect request to a port nobody listens on is rejected, quickly.
#[test]
#[ignore = "RDMA tier: runs in the soft-RoCE VM (scripts/test)"]
fn cm_connect_to_a_closed_port_is_rejected() {
    let support::RawClient { ch, id, .. } = support::raw_client(support::addr(2));
    let t0 = std::time::Instant::now();
    id.connect(&ConnParam {
        private_data: b"nobody home",
        ..Default::default()
    })
    .unwrap();
    let ev = ch.next_event(T).expect("an answer");
    assert_eq!(ev.kind, ev::RDMA_CM_EVENT_REJECTED, "got {}", ev.name());
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "reject took {:?}",
        t0.elapsed()
    );
}

fn unsafe_zeroed_wc() -> ffi::ibv_wc {
    // SAFETY: ibv_wc is a plain C struct; all-zero is valid.
    unsafe { std::mem::zeroed() }
}
