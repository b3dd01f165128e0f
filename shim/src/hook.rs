//! The closed list of intercepted entry points. A [`Hook`] indexes the real-function table and
//! the per-hook call counters; its name is both the libc symbol and the key in the stats JSON.

macro_rules! hooks {
    ($($variant:ident = $sym:literal),* $(,)?) => {
        /// One intercepted libc entry point.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Hook { $($variant),* }

        impl Hook {
            /// Every hook, in declaration (and stats) order.
            pub const ALL: &'static [Hook] = &[$(Hook::$variant),*];
            /// Number of hooks.
            pub const COUNT: usize = Self::ALL.len();

            /// The libc symbol name, which is also the stats key.
            pub const fn name(self) -> &'static str {
                match self { $(Hook::$variant => $sym),* }
            }

            /// The symbol name as a NUL-terminated string, for `dlsym`.
            pub const fn c_name(self) -> &'static [u8] {
                match self { $(Hook::$variant => concat!($sym, "\0").as_bytes()),* }
            }
        }
    };
}

hooks! {
    Socket = "socket",
    Socketpair = "socketpair",
    Bind = "bind",
    Listen = "listen",
    Accept = "accept",
    Accept4 = "accept4",
    Connect = "connect",
    Getsockopt = "getsockopt",
    Setsockopt = "setsockopt",
    Getsockname = "getsockname",
    Getpeername = "getpeername",
    Shutdown = "shutdown",
    Close = "close",
    Read = "read",
    Write = "write",
    Readv = "readv",
    Writev = "writev",
    Pread = "pread",
    Pread64 = "pread64",
    Pwrite = "pwrite",
    Pwrite64 = "pwrite64",
    Recv = "recv",
    Recvfrom = "recvfrom",
    Recvmsg = "recvmsg",
    Recvmmsg = "recvmmsg",
    Send = "send",
    Sendto = "sendto",
    Sendmsg = "sendmsg",
    Sendmmsg = "sendmmsg",
    Sendfile = "sendfile",
    Sendfile64 = "sendfile64",
    Splice = "splice",
    ReadChk = "__read_chk",
    PreadChk = "__pread_chk",
    Pread64Chk = "__pread64_chk",
    RecvChk = "__recv_chk",
    RecvfromChk = "__recvfrom_chk",
    PollChk = "__poll_chk",
    PpollChk = "__ppoll_chk",
    FdeltChk = "__fdelt_chk",
    Poll = "poll",
    Ppoll = "ppoll",
    Select = "select",
    Pselect = "pselect",
    EpollCreate = "epoll_create",
    EpollCreate1 = "epoll_create1",
    EpollCtl = "epoll_ctl",
    EpollWait = "epoll_wait",
    EpollPwait = "epoll_pwait",
    EpollPwait2 = "epoll_pwait2",
    Fcntl = "fcntl",
    Fcntl64 = "fcntl64",
    Ioctl = "ioctl",
    Dup = "dup",
    Dup2 = "dup2",
    Dup3 = "dup3",
    CloseRange = "close_range",
    Closefrom = "closefrom",
    Fork = "fork",
    Execve = "execve",
    Fdopen = "fdopen",
    Execv = "execv",
    Execvp = "execvp",
    Execvpe = "execvpe",
    Fexecve = "fexecve",
    PosixSpawn = "posix_spawn",
    PosixSpawnp = "posix_spawnp",
    System = "system",
    Popen = "popen",
    Exit = "_exit",
    ExitUpper = "_Exit",
    Setuid = "setuid",
    Setgid = "setgid",
    Seteuid = "seteuid",
    Setegid = "setegid",
    Setreuid = "setreuid",
    Setregid = "setregid",
    Setresuid = "setresuid",
    Setresgid = "setresgid",
    Setgroups = "setgroups",
    Setfsuid = "setfsuid",
    Setfsgid = "setfsgid",
    Capset = "capset",
    Prctl = "prctl",
    Syscall = "syscall",
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_nul_terminated() {
        let mut seen = std::collections::HashSet::new();
        for (i, h) in Hook::ALL.iter().enumerate() {
            assert_eq!(*h as usize, i);
            assert!(seen.insert(h.name()));
            let c = h.c_name();
            assert_eq!(c.last(), Some(&0));
            assert_eq!(&c[..c.len() - 1], h.name().as_bytes());
        }
    }
}
