//! The one conversion between socket addresses as the C API lays them out (`sockaddr_in`,
//! `sockaddr_in6`) and [`SocketAddr`], both ways, for the transport and the preload shim
//! alike: port and IPv4 address in network byte order, and for IPv6 the flow label and the
//! scope id too (a link-local address without its interface names another peer, or none).
#![allow(unsafe_code)]

use std::mem::size_of;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// `addr` as a `sockaddr_storage` and the length of the family's structure in it (what
/// bind/connect take).
pub fn to_raw(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage (and the padding the kernel expects).
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let p = (&mut ss as *mut libc::sockaddr_storage).cast::<u8>();
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write(p.cast(), sin) };
            (ss, size_of::<libc::sockaddr_in>() as libc::socklen_t)
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write(p.cast(), sin6) };
            (ss, size_of::<libc::sockaddr_in6>() as libc::socklen_t)
        }
    }
}

/// The address of family AF_INET or AF_INET6 at `sa`, `len` bytes long; `None` for a null
/// pointer, another family, or a length too short for the family's structure. No alignment
/// is assumed.
///
/// # Safety
/// `sa` is null or points to `len` readable bytes.
pub unsafe fn from_raw(sa: *const libc::sockaddr, len: usize) -> Option<SocketAddr> {
    if sa.is_null() || len < size_of::<libc::sa_family_t>() {
        return None;
    }
    let p = sa.cast::<u8>();
    // SAFETY: the family is the first field, within the `len` readable bytes (checked above).
    let family = unsafe { std::ptr::read_unaligned(p.cast::<libc::sa_family_t>()) };
    match libc::c_int::from(family) {
        libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: a sockaddr_in lies in the `len` readable bytes (checked above).
            let sin = unsafe { std::ptr::read_unaligned(p.cast::<libc::sockaddr_in>()) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: a sockaddr_in6 lies in the `len` readable bytes (checked above).
            let sin6 = unsafe { std::ptr::read_unaligned(p.cast::<libc::sockaddr_in6>()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// [`from_raw`] of a whole `sockaddr_storage` (what getsockname/getpeername fill).
pub fn from_storage(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    // SAFETY: a reference to a whole sockaddr_storage: that many readable bytes.
    unsafe {
        from_raw(
            (ss as *const libc::sockaddr_storage).cast(),
            size_of::<libc::sockaddr_storage>(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_families_round_trip_with_the_scope_and_flow_of_ipv6() {
        let v4: SocketAddr = "192.0.2.7:4321".parse().unwrap();
        let v6 = SocketAddr::V6(SocketAddrV6::new(
            "fe80::1:2".parse().unwrap(),
            6379,
            0x000a_bcde,
            3,
        ));
        for a in [v4, v6] {
            let (ss, len) = to_raw(a);
            assert_eq!(from_storage(&ss), Some(a));
            // SAFETY: `len` bytes of a live sockaddr_storage.
            let back =
                unsafe { from_raw((&ss as *const libc::sockaddr_storage).cast(), len as usize) };
            assert_eq!(back, Some(a));
        }
        let (ss, len) = to_raw(v4);
        assert_eq!(len as usize, size_of::<libc::sockaddr_in>());
        // (network byte order in memory, as the kernel lays it out)
        // SAFETY: the storage holds the sockaddr_in just written, and is aligned for it.
        let raw = unsafe { &*(&ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
        assert_eq!(raw.sin_port.to_ne_bytes(), 4321u16.to_be_bytes());
        assert_eq!(raw.sin_addr.s_addr.to_ne_bytes(), [192, 0, 2, 7]);
    }

    #[test]
    fn short_null_unaligned_and_foreign_addresses() {
        let a: SocketAddr = "[2001:db8::5]:80".parse().unwrap();
        let (ss, len) = to_raw(a);
        let p = (&ss as *const libc::sockaddr_storage).cast::<libc::sockaddr>();
        // SAFETY: each length is within the live storage; null is allowed.
        unsafe {
            assert_eq!(from_raw(p, len as usize - 1), None);
            assert_eq!(from_raw(p, 1), None);
            assert_eq!(from_raw(std::ptr::null(), 128), None);
        }
        // one byte off any alignment
        let mut buf = [0u8; 1 + size_of::<libc::sockaddr_storage>()];
        // SAFETY: copying the storage's bytes into a buffer large enough.
        unsafe {
            std::ptr::copy_nonoverlapping(p.cast::<u8>(), buf.as_mut_ptr().add(1), len as usize)
        };
        // SAFETY: `len` readable bytes from byte 1 of `buf`.
        let odd = unsafe { from_raw(buf.as_ptr().add(1).cast(), len as usize) };
        assert_eq!(odd, Some(a));
        let mut unix = [0u8; 16];
        unix[..2].copy_from_slice(&(libc::AF_UNIX as libc::sa_family_t).to_ne_bytes());
        // SAFETY: 16 readable bytes.
        assert_eq!(unsafe { from_raw(unix.as_ptr().cast(), 16) }, None);
    }
}
