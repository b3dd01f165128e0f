//! Host tier: the C structures rdmashim allocates, fills or reads have the same size and field
//! offsets in Rust (rdma-mummy-sys' bindings and hand-written unions) as in the system's
//! rdma-core headers. A mismatch here would corrupt work requests silently on the device.
//!
//! Needs a C compiler and libibverbs-dev/librdmacm-dev (installed by scripts/setup).

use std::mem::{offset_of, size_of};
use std::process::Command;

use rdmashim_core::sys::ffi;

macro_rules! layout {
    ($($ty:ident { $($f:ident $(. $g:ident)*),* })*) => {{
        let mut c = String::new();
        let mut rust = String::new();
        $(
            c.push_str(&format!("printf(\"{} size %zu\\n\", sizeof(struct {}));\n", stringify!($ty), stringify!($ty)));
            rust.push_str(&format!("{} size {}\n", stringify!($ty), size_of::<ffi::$ty>()));
            $(
                let path = concat!(stringify!($f) $(, ".", stringify!($g))*);
                c.push_str(&format!(
                    "printf(\"{} {} %zu\\n\", offsetof(struct {}, {}));\n",
                    stringify!($ty), path, stringify!($ty), c_path(path)
                ));
                rust.push_str(&format!("{} {} {}\n", stringify!($ty), path, offset_of!(ffi::$ty, $f $(. $g)*)));
            )*
        )*
        (c, rust)
    }};
}

/// Rust names of the hand-written unions → the C member names.
fn c_path(p: &str) -> String {
    p.replace("imm_data_invalidated_rkey_union.imm_data", "imm_data")
}

#[test]
fn structures_match_the_system_headers() {
    let (body, expected) = layout! {
        ibv_sge { addr, length, lkey }
        ibv_send_wr { wr_id, next, sg_list, num_sge, opcode, send_flags, wr }
        ibv_recv_wr { wr_id, next, sg_list, num_sge }
        ibv_wc { wr_id, status, opcode, vendor_err, byte_len, qp_num, src_qp, wc_flags, pkey_index, slid, sl, dlid_path_bits }
        ibv_qp_init_attr { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all }
        ibv_qp_cap { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data }
        ibv_mr { context, pd, addr, length, handle, lkey, rkey }
        ibv_comp_channel { context, fd, refcnt }
        ibv_port_attr { state, max_mtu, active_mtu, gid_tbl_len, lid, link_layer }
        ibv_device_attr { fw_ver, max_mr_size, max_qp, max_cqe, max_qp_rd_atom, phys_port_cnt }
        rdma_conn_param { private_data, private_data_len, responder_resources, initiator_depth, retry_count, rnr_retry_count, srq, qp_num }
        rdma_cm_event { id, listen_id, event, status, param }
        rdma_cm_id { verbs, channel, context, qp, route, ps, port_num, event, send_cq, recv_cq, pd, qp_type }
        ibv_context { device, ops, cmd_fd, async_fd, num_comp_vectors }
        ibv_qp { context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type }
    };
    // the WITH_IMM field sits right after send_flags / byte_len, by name in C
    let extra_c = "printf(\"imm %zu %zu\\n\", offsetof(struct ibv_send_wr, imm_data), offsetof(struct ibv_wc, imm_data));\n";
    let extra_rust = format!(
        "imm {} {}\n",
        offset_of!(ffi::ibv_send_wr, imm_data_invalidated_rkey_union),
        offset_of!(ffi::ibv_wc, imm_data_invalidated_rkey_union)
    );
    let src = format!(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\n\
         int main(void) {{\n{body}{extra_c}return 0;\n}}\n"
    );
    let dir = std::env::temp_dir().join(format!("rdmashim-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c_file = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&c_file, src).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .arg(&c_file)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e} (scripts/setup installs a C compiler)"));
    assert!(
        out.status.success(),
        "compiling the layout probe failed (are libibverbs-dev and librdmacm-dev installed? \
         scripts/setup installs them):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let c_says = String::from_utf8(run.stdout).unwrap();
    let rust_says = expected + &extra_rust;
    let _ = std::fs::remove_dir_all(&dir);
    for (c, r) in c_says.lines().zip(rust_says.lines()) {
        if let (Some(cs), Some(rs)) = (
            c.strip_prefix("ibv_port_attr size "),
            r.strip_prefix("ibv_port_attr size "),
        ) {
            // newer headers (the bindings') append fields; a larger buffer is what we pass
            assert!(
                rs.parse::<usize>().unwrap() >= cs.parse::<usize>().unwrap(),
                "{c} vs {r}"
            );
            continue;
        }
        assert_eq!(
            c, r,
            "layout differs between the C headers (left) and Rust (right)"
        );
    }
    assert_eq!(c_says.lines().count(), rust_says.lines().count());
}
