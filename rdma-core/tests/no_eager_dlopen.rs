//! Host tier: linking rdmashim's transport does not load libibverbs/librdmacm into a process
//! that never asks for RDMA. (rdma-mummy-sys' C wrappers would: their object file carries a
//! constructor that dlopens libibverbs at start-up. This crate must not pull that object in.)
//!
//! One test in its own binary, so nothing else in the process touches RDMA first.

fn mapped(lib: &str) -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .expect("read /proc/self/maps")
        .lines()
        .any(|l| l.contains(lib))
}

#[test]
fn rdma_libraries_load_only_when_first_used() {
    // Touch the crate so it is linked in, without asking for RDMA.
    let e = rdmashim_core::Error::InvalidArgument("x");
    assert!(e.to_string().contains("invalid argument"));
    assert!(!rdmashim_core::sys::loaded());
    assert!(
        !mapped("libibverbs.so"),
        "libibverbs was loaded before anything asked for RDMA"
    );
    assert!(
        !mapped("librdmacm.so"),
        "librdmacm was loaded before anything asked for RDMA"
    );

    // Now ask: on a host with rdma-core installed the libraries load on demand.
    let r = rdmashim_core::sys::lib();
    assert!(rdmashim_core::sys::loaded());
    if r.is_ok() {
        assert!(mapped("libibverbs.so.1") && mapped("librdmacm.so.1"));
    }
}
