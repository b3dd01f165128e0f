//! Host tier: without RDMA the native API and the link set-up fail with a clean `Unsupported`
//! error naming why (no panic, no hang).

use std::io::ErrorKind;
use std::time::Duration;

use rdmashim_core::{Dialer, Listener, Stream, StreamConfig, UpgradeListener};
use rdmashim_proto::Proof;

fn host_has_rdma() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

#[test]
fn connect_and_bind_report_unavailable_without_rdma() {
    if host_has_rdma() {
        return; // the RDMA tier covers this host
    }
    let cfg = StreamConfig {
        connect_timeout: Duration::from_millis(200),
        ..StreamConfig::default()
    };
    let e = Stream::connect_with("127.0.0.1:7471".parse().unwrap(), cfg).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    let inner = e
        .get_ref()
        .and_then(|i| i.downcast_ref::<rdmashim_core::Error>())
        .expect("the rdmashim error is kept");
    assert!(
        matches!(inner, rdmashim_core::Error::Unavailable(_)),
        "{inner}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("no RDMA device") || msg.contains("RDMA libraries missing"),
        "{msg}"
    );
    let e = Listener::bind("127.0.0.1:7471".parse().unwrap())
        .err()
        .expect("bind fails");
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
}

#[test]
fn link_setup_reports_unavailable_without_rdma() {
    if host_has_rdma() {
        return;
    }
    let e = UpgradeListener::bind("0.0.0.0:7471".parse().unwrap()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    let cfg = StreamConfig::default();
    let e = Dialer::start(
        None,
        "127.0.0.1:7471".parse().unwrap(),
        40000,
        Proof::Native,
        &cfg,
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    let src = Some("127.0.0.1:0".parse().unwrap());
    let e = Dialer::start(
        src,
        "127.0.0.1:7471".parse().unwrap(),
        40000,
        Proof::Native,
        &cfg,
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(
        e.to_string().contains("no RDMA device") || e.to_string().contains("RDMA libraries"),
        "{e}"
    );
}

#[test]
fn bad_configurations_are_invalid_input() {
    if host_has_rdma() {
        return;
    }
    // Unavailability is reported first on a host without RDMA; only check there is no panic.
    let cfg = StreamConfig {
        ring_size: 3000,
        ..StreamConfig::default()
    };
    assert!(Stream::connect_with("127.0.0.1:7471".parse().unwrap(), cfg).is_err());
}
