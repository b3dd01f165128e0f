//! Host tier: without RDMA the library reports why, cleanly.

use rdmashim_core::sys::Lib;
use rdmashim_core::{probe, Unavailable};

#[test]
fn missing_libraries_are_reported_by_name() {
    let e = Lib::load_from("libibverbs-rdmashim-absent.so.1", "librdmacm.so.1").unwrap_err();
    assert_eq!(e.library, "libibverbs-rdmashim-absent.so.1");
    assert!(e.symbol.is_none());
    assert!(
        e.to_string()
            .contains("cannot load libibverbs-rdmashim-absent.so.1"),
        "{e}"
    );

    // A library that loads but is not rdma-core: the first missing symbol is named.
    let e = Lib::load_from("libc.so.6", "libc.so.6").unwrap_err();
    assert_eq!(e.symbol, Some("ibv_get_device_list"));
}

#[test]
fn probe_explains_why_there_is_no_rdma() {
    let has_devices = std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    match probe::probe() {
        Ok(devs) => {
            assert!(
                has_devices,
                "probe found {devs:?} but sysfs lists no RDMA device"
            );
            assert!(!devs.is_empty());
        }
        Err(Unavailable::NoDevice) => {
            assert!(!has_devices, "sysfs lists devices, probe found none")
        }
        Err(Unavailable::LibrariesMissing(e)) => {
            // Only acceptable where rdma-core is really absent.
            assert!(
                !std::path::Path::new("/usr/lib/x86_64-linux-gnu/libibverbs.so.1").exists(),
                "libibverbs.so.1 is installed but failed to load: {e}"
            );
        }
    }
}

#[test]
fn transport_calls_fail_with_a_typed_error_without_a_device() {
    if std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some()) {
        return; // this host has RDMA: the RDMA tier covers it
    }
    match rdmashim_core::verbs::Context::open("rxe0") {
        Err(rdmashim_core::Error::Unavailable(_)) | Err(rdmashim_core::Error::NoSuchDevice(_)) => {}
        Err(e) => panic!("unexpected error kind: {e}"),
        Ok(_) => panic!("opened rxe0 on a host without RDMA devices"),
    }
}
