//! Data transfer: read, write, readv, writev, pread*, pwrite*, recv*, send*, sendfile*, splice.
//! On an fd the table does not mark as a TCP stream these are pure pass-through after one table
//! lookup; on TCP streams the real call is made here and its byte count recorded.

use super::conn;
use super::hook;
use super::passing;
use super::up;
use crate::fdtable::TABLE;
use crate::outcome::Errno;
use crate::outcome::Outcome::{Fail, Handled, PassThrough};
use crate::stats::Bytes;
use core::ffi::{c_int, c_uint, c_void};
use libc::{
    iovec, mmsghdr, msghdr, off64_t, off_t, size_t, sockaddr, socklen_t, ssize_t, timespec,
};

hook! {
    /// read(2).
    fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t;
    id: Read;
    fallback: syscall(SYS_read; fd, buf, count);
    fast: io(fd, TcpRx);
    |real, cx| {
        // SAFETY: the caller's arguments, unchanged, to the real function.
        if let Some(o) = up::route(fd, |c| up::recv_flat(cx, c, fd, buf, count, 0)) {
            return o;
        }
        // SAFETY: the caller's arguments, unchanged, to the real function.
        conn::tcp_io(cx, fd, Bytes::TcpRx, || unsafe { real(fd, buf, count) })
    }
}

hook! {
    /// write(2).
    fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t;
    id: Write;
    fallback: syscall(SYS_write; fd, buf, count);
    fast: io(fd, TcpTx);
    |real, cx| {
        // SAFETY: the caller's arguments, unchanged, to the real function.
        if let Some(o) = up::route(fd, |c| up::send_flat(cx, c, fd, buf, count, 0)) {
            return o;
        }
        // SAFETY: the caller's arguments, unchanged, to the real function.
        conn::tcp_io(cx, fd, Bytes::TcpTx, || unsafe { real(fd, buf, count) })
    }
}

hook! {
    /// readv(2).
    fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t;
    id: Readv;
    fallback: syscall(SYS_readv; fd, iov, cnt);
    fast: io(fd, TcpRx);
    |real, cx| {
        // SAFETY: the caller's arguments, unchanged, to the real function.
        if let Some(o) = up::route(fd, |c| up::recv_iov(cx, c, fd, iov, cnt, 0)) {
            return o;
        }
        // SAFETY: the caller's arguments, unchanged, to the real function.
        conn::tcp_io(cx, fd, Bytes::TcpRx, || unsafe { real(fd, iov, cnt) })
    }
}

hook! {
    /// writev(2).
    fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t;
    id: Writev;
    fallback: syscall(SYS_writev; fd, iov, cnt);
    fast: io(fd, TcpTx);
    |real, cx| {
        // SAFETY: the caller's arguments, unchanged, to the real function.
        if let Some(o) = up::route(fd, |c| up::send_iov(cx, c, fd, iov, cnt, 0)) {
            return o;
        }
        // SAFETY: the caller's arguments, unchanged, to the real function.
        conn::tcp_io(cx, fd, Bytes::TcpTx, || unsafe { real(fd, iov, cnt) })
    }
}

hook! {
    /// pread(2): fails with ESPIPE on sockets, so it never carries socket data; counted only.
    fn pread(fd: c_int, buf: *mut c_void, count: size_t, off: off_t) -> ssize_t;
    id: Pread;
    fallback: syscall(SYS_pread64; fd, buf, count, off);
    fast: always(crate::stats::fd_shard(fd));
    |_real, _cx| { PassThrough }
}

hook! {
    /// pread64: as pread.
    fn pread64(fd: c_int, buf: *mut c_void, count: size_t, off: off64_t) -> ssize_t;
    id: Pread64;
    fallback: syscall(SYS_pread64; fd, buf, count, off);
    fast: always(crate::stats::fd_shard(fd));
    |_real, _cx| { PassThrough }
}

hook! {
    /// pwrite(2): ESPIPE on sockets; counted only.
    fn pwrite(fd: c_int, buf: *const c_void, count: size_t, off: off_t) -> ssize_t;
    id: Pwrite;
    fallback: syscall(SYS_pwrite64; fd, buf, count, off);
    fast: always(crate::stats::fd_shard(fd));
    |_real, _cx| { PassThrough }
}

hook! {
    /// pwrite64: as pwrite.
    fn pwrite64(fd: c_int, buf: *const c_void, count: size_t, off: off64_t) -> ssize_t;
    id: Pwrite64;
    fallback: syscall(SYS_pwrite64; fd, buf, count, off);
    fast: always(crate::stats::fd_shard(fd));
    |_real, _cx| { PassThrough }
}

hook! {
    /// recv(2).
    fn recv(fd: c_int, buf: *mut c_void, len: size_t, fl: c_int) -> ssize_t;
    id: Recv;
    fallback: syscall(SYS_recvfrom; fd, buf, len, fl, core::ptr::null_mut::<sockaddr>(), core::ptr::null_mut::<socklen_t>());
    fast: io(fd, TcpRx);
    |real, cx| {
        // SAFETY: the caller's arguments, unchanged, to the real function.
        if let Some(o) = up::route(fd, |c| up::recv_flat(cx, c, fd, buf, len, fl)) {
            return o;
        }
        // SAFETY: the caller's arguments, unchanged, to the real function.
        conn::tcp_io(cx, fd, Bytes::TcpRx, || unsafe { real(fd, buf, len, fl) })
    }
}

hook! {
    /// recvfrom(2).
    fn recvfrom(fd: c_int, buf: *mut c_void, len: size_t, fl: c_int, addr: *mut sockaddr, alen: *mut socklen_t) -> ssize_t;
    id: Recvfrom;
    fallback: syscall(SYS_recvfrom; fd, buf, len, fl, addr, alen);
    fast: io(fd, TcpRx);
    |real, cx| {
        // SAFETY: the caller's arguments, unchanged, to the real function.
        if let Some(o) = up::route(fd, |c| {
            if !alen.is_null() {
                // SAFETY: the caller's address-length out-parameter: TCP reports no address.
                unsafe { *alen = 0 };
            }
            up::recv_flat(cx, c, fd, buf, len, fl)
        }) {
            return o;
        }
        // SAFETY: the caller's arguments, unchanged, to the real function.
        conn::tcp_io(cx, fd, Bytes::TcpRx, || unsafe { real(fd, buf, len, fl, addr, alen) })
    }
}

hook! {
    /// recvmsg(2).
    fn recvmsg(fd: c_int, msg: *mut msghdr, fl: c_int) -> ssize_t;
    id: Recvmsg;
    fallback: syscall(SYS_recvmsg; fd, msg, fl);
    // SAFETY: recvmsg's message, valid or null.
    fast: io_unless(unsafe { passing::may_receive_fds(msg) }, fd, TcpRx);
    |real, cx| {
        // SAFETY: the caller's arguments, unchanged, to the real function.
        if let Some(o) = up::route(fd, |c| up::recv_msg(cx, c, fd, msg, fl)) {
            return o;
        }
        if !TABLE.get(fd).is_tcp_stream() {
            // (a unix socket: descriptors may come with the message)
            // SAFETY: the caller's arguments, unchanged, to the real function.
            let n = unsafe { real(fd, msg, fl) };
            if n >= 0 && !msg.is_null() {
                // SAFETY: the message recvmsg has just filled.
                unsafe { passing::after_receive(&*msg) };
            }
            return Handled(n);
        }
        // SAFETY: the caller's arguments, unchanged, to the real function.
        conn::tcp_io(cx, fd, Bytes::TcpRx, || unsafe { real(fd, msg, fl) })
    }
}

hook! {
    /// send(2).
    fn send(fd: c_int, buf: *const c_void, len: size_t, fl: c_int) -> ssize_t;
    id: Send;
    fallback: syscall(SYS_sendto; fd, buf, len, fl, core::ptr::null::<sockaddr>(), 0 as socklen_t);
    fast: io(fd, TcpTx);
    |real, cx| {
        // SAFETY: the caller's arguments, unchanged, to the real function.
        if let Some(o) = up::route(fd, |c| up::send_flat(cx, c, fd, buf, len, fl)) {
            return o;
        }
        // SAFETY: the caller's arguments, unchanged, to the real function.
        conn::tcp_io(cx, fd, Bytes::TcpTx, || unsafe { real(fd, buf, len, fl) })
    }
}

hook! {
    /// sendto(2).
    fn sendto(fd: c_int, buf: *const c_void, len: size_t, fl: c_int, addr: *const sockaddr, alen: socklen_t) -> ssize_t;
    id: Sendto;
    fallback: syscall(SYS_sendto; fd, buf, len, fl, addr, alen);
    fast: io(fd, TcpTx);
    |real, cx| {
        // SAFETY: the caller's arguments, unchanged, to the real function.
        if let Some(o) = up::route(fd, |c| up::send_flat(cx, c, fd, buf, len, fl)) {
            return o;
        }
        // SAFETY: the caller's arguments, unchanged, to the real function.
        conn::tcp_io(cx, fd, Bytes::TcpTx, || unsafe { real(fd, buf, len, fl, addr, alen) })
    }
}

hook! {
    /// sendmsg(2).
    fn sendmsg(fd: c_int, msg: *const msghdr, fl: c_int) -> ssize_t;
    id: Sendmsg;
    fallback: syscall(SYS_sendmsg; fd, msg, fl);
    // SAFETY: sendmsg's message, valid or null.
    fast: io_unless(unsafe { passing::may_send_fds(msg) }, fd, TcpTx);
    |real, cx| {
        // SAFETY: sendmsg's message, valid or null.
        if unsafe { passing::may_send_fds(msg) } {
            // SAFETY: as above, and not null.
            unsafe { passing::before_send(&*msg) };
        }
        // SAFETY: the caller's arguments, unchanged, to the real function.
        if let Some(o) = up::route(fd, |c| up::send_msg(cx, c, fd, msg, fl)) {
            return o;
        }
        // SAFETY: the caller's arguments, unchanged, to the real function.
        conn::tcp_io(cx, fd, Bytes::TcpTx, || unsafe { real(fd, msg, fl) })
    }
}

/// Total bytes of the first `n` messages of an mmsghdr vector.
///
/// # Safety
/// `v` must point to at least `n` initialised `mmsghdr`s (true after a successful
/// recvmmsg/sendmmsg returned `n`).
unsafe fn mmsg_bytes(v: *const mmsghdr, n: c_int) -> isize {
    let mut total: isize = 0;
    for i in 0..n.max(0) as usize {
        // SAFETY: i < n, guaranteed valid by the caller.
        let len = unsafe { (*v.add(i)).msg_len };
        total = total.wrapping_add(len as isize);
    }
    total
}

hook! {
    /// recvmmsg(2): bytes are the sum of the received messages' lengths.
    fn recvmmsg(fd: c_int, v: *mut mmsghdr, vlen: c_uint, fl: c_int, tmo: *mut timespec) -> c_int;
    id: Recvmmsg;
    fallback: syscall(SYS_recvmmsg; fd, v, vlen, fl, tmo);
    // SAFETY: recvmmsg's vector of `vlen` messages, valid or null.
    fast: not_tcp_unless(unsafe { passing::may_receive_fds_mmsg(v, vlen) }, fd);
    |real, cx| {
        let e = TABLE.get(fd);
        if !e.is_tcp_stream() {
            // (a unix socket: descriptors may come with the messages)
            // SAFETY: the caller's arguments.
            let n = unsafe { real(fd, v, vlen, fl, tmo) };
            // SAFETY: on success the first n entries of the caller's vector were filled.
            unsafe { passing::after_receive_mmsg(v, n) };
            return Handled(n);
        }
        if !matches!(up::of(e), up::Up::Tcp) {
            // Message vectors on a stream socket: not carried over the ring.
            return Fail(Errno(libc::EOPNOTSUPP));
        }
        // SAFETY: the caller's arguments.
        let n = unsafe { real(fd, v, vlen, fl, tmo) };
        // SAFETY: on success the first n entries of the caller's vector were filled.
        let bytes = if n > 0 { unsafe { mmsg_bytes(v, n) } } else { n as isize };
        conn::on_io(cx, fd, e, bytes, Bytes::TcpRx);
        Handled(n)
    }
}

hook! {
    /// sendmmsg(2): bytes are the sum of the sent messages' lengths.
    fn sendmmsg(fd: c_int, v: *mut mmsghdr, vlen: c_uint, fl: c_int) -> c_int;
    id: Sendmmsg;
    fallback: syscall(SYS_sendmmsg; fd, v, vlen, fl);
    // SAFETY: sendmmsg's vector of `vlen` messages, valid or null.
    fast: not_tcp_unless(unsafe { passing::may_send_fds_mmsg(v, vlen) }, fd);
    |real, cx| {
        // SAFETY: as above.
        if unsafe { passing::may_send_fds_mmsg(v, vlen) } {
            // SAFETY: as above, and not null.
            unsafe { passing::before_send_mmsg(v, vlen) };
        }
        let e = TABLE.get(fd);
        if !e.is_tcp_stream() {
            return PassThrough;
        }
        if !matches!(up::of(e), up::Up::Tcp) {
            return Fail(Errno(libc::EOPNOTSUPP));
        }
        // SAFETY: the caller's arguments.
        let n = unsafe { real(fd, v, vlen, fl) };
        // SAFETY: on success msg_len of the first n entries was set.
        let bytes = if n > 0 { unsafe { mmsg_bytes(v, n) } } else { n as isize };
        conn::on_io(cx, fd, e, bytes, Bytes::TcpTx);
        Handled(n)
    }
}

hook! {
    /// sendfile(2): file to socket (iperf3 -Z); counted as TCP bytes sent on `out_fd`.
    fn sendfile(out_fd: c_int, in_fd: c_int, off: *mut off_t, count: size_t) -> ssize_t;
    id: Sendfile;
    fallback: syscall(SYS_sendfile; out_fd, in_fd, off, count);
    fast: io(out_fd, TcpTx);
    |real, cx| {
        // SAFETY: the caller's arguments, unchanged, to the real function.
        if let Some(o) = up::route(out_fd, |c| up::send_file(cx, c, out_fd, in_fd, off.cast::<i64>(), count)) {
            return o;
        }
        // SAFETY: the caller's arguments, unchanged, to the real function.
        conn::tcp_io(cx, out_fd, Bytes::TcpTx, || unsafe { real(out_fd, in_fd, off, count) })
    }
}

hook! {
    /// sendfile64: as sendfile.
    fn sendfile64(out_fd: c_int, in_fd: c_int, off: *mut off64_t, count: size_t) -> ssize_t;
    id: Sendfile64;
    fallback: syscall(SYS_sendfile; out_fd, in_fd, off, count);
    fast: io(out_fd, TcpTx);
    |real, cx| {
        // SAFETY: the caller's arguments, unchanged, to the real function.
        if let Some(o) = up::route(out_fd, |c| up::send_file(cx, c, out_fd, in_fd, off.cast::<i64>(), count)) {
            return o;
        }
        // SAFETY: the caller's arguments, unchanged, to the real function.
        conn::tcp_io(cx, out_fd, Bytes::TcpTx, || unsafe { real(out_fd, in_fd, off, count) })
    }
}

hook! {
    /// splice(2): a socket on either side (counted as received on `fd_in`, sent on `fd_out`).
    fn splice(fd_in: c_int, off_in: *mut off64_t, fd_out: c_int, off_out: *mut off64_t, len: size_t, fl: c_uint) -> ssize_t;
    id: Splice;
    fallback: syscall(SYS_splice; fd_in, off_in, fd_out, off_out, len, fl);
    |real, cx| {
        let (ei, eo) = (TABLE.get(fd_in), TABLE.get(fd_out));
        if !ei.is_tcp_stream() && !eo.is_tcp_stream() {
            return PassThrough;
        }
        if !matches!(up::of(ei), up::Up::Tcp) || !matches!(up::of(eo), up::Up::Tcp) {
            // splice moves pages between kernel buffers; the ring is not one.
            return Fail(Errno(libc::EINVAL));
        }
        // SAFETY: the caller's arguments.
        let n = unsafe { real(fd_in, off_in, fd_out, off_out, len, fl) };
        if ei.is_tcp_stream() {
            conn::on_io(cx, fd_in, ei, n, Bytes::TcpRx);
        }
        if eo.is_tcp_stream() {
            conn::on_io(cx, fd_out, eo, n, Bytes::TcpTx);
        }
        Handled(n)
    }
}
