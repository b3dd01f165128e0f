//! What a hook's logic decided, and its conversion to the C return convention.
//!
//! Every hook body returns an [`Outcome`]; the hook wrapper (`hooks/mod.rs`) turns it into the
//! value the caller sees with [`Outcome::into_ret`] and nowhere else: `PassThrough` calls the real
//! libc function with the caller's arguments (errno is whatever libc leaves), `Handled(v)` returns
//! `v` unchanged, `Fail(e)` sets errno to `e` and returns the function's failure value (`-1`).

/// An errno value (a positive `E*` constant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    pub const EIO: Errno = Errno(libc::EIO);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    pub const EBADF: Errno = Errno(libc::EBADF);
    pub const ECONNRESET: Errno = Errno(libc::ECONNRESET);

    /// glibc's words for the errors a file of the shim's can meet (opening, writing, renaming
    /// it), in the C locale; `None` for others. A table, not `strerror`: that may translate
    /// (gettext allocates and locks) and the shim writes its messages wherever it is.
    pub fn words(self) -> Option<&'static str> {
        Some(match self.0 {
            libc::EPERM => "Operation not permitted",
            libc::ENOENT => "No such file or directory",
            libc::EINTR => "Interrupted system call",
            libc::EIO => "Input/output error",
            libc::ENXIO => "No such device or address",
            libc::EBADF => "Bad file descriptor",
            libc::EAGAIN => "Resource temporarily unavailable",
            libc::ENOMEM => "Cannot allocate memory",
            libc::EACCES => "Permission denied",
            libc::EBUSY => "Device or resource busy",
            libc::EEXIST => "File exists",
            libc::EXDEV => "Invalid cross-device link",
            libc::ENOTDIR => "Not a directory",
            libc::EISDIR => "Is a directory",
            libc::EINVAL => "Invalid argument",
            libc::ENFILE => "Too many open files in system",
            libc::EMFILE => "Too many open files",
            libc::ETXTBSY => "Text file busy",
            libc::EFBIG => "File too large",
            libc::ENOSPC => "No space left on device",
            libc::EROFS => "Read-only file system",
            libc::EMLINK => "Too many links",
            libc::EPIPE => "Broken pipe",
            libc::ENAMETOOLONG => "File name too long",
            libc::ENOSYS => "Function not implemented",
            libc::ELOOP => "Too many levels of symbolic links",
            libc::EOVERFLOW => "Value too large for defined data type",
            libc::EDQUOT => "Disk quota exceeded",
            libc::ESTALE => "Stale file handle",
            _ => return None,
        })
    }
}

/// `Permission denied (errno 13)`; `errno N` for an error not in [`Errno::words`]'s table.
impl core::fmt::Display for Errno {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.words() {
            Some(w) => write!(f, "{w} (errno {})", self.0),
            None => write!(f, "errno {}", self.0),
        }
    }
}

/// The decision of a hook's logic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The shim produced the result itself (possibly after calling the real function).
    Handled(T),
    /// Call the real libc function with the caller's arguments and return what it returns.
    PassThrough,
    /// Fail the call with this errno.
    Fail(Errno),
}

/// Return types of hooked functions: how each reports failure.
pub trait CRet: Copy {
    /// The failure value (`-1` for integers); `None` for functions that cannot fail (`void`).
    const FAILURE: Option<Self>;
}

macro_rules! cret_minus_one {
    ($($t:ty),*) => {$(impl CRet for $t { const FAILURE: Option<Self> = Some(-1); })*};
}
cret_minus_one!(i32, i64, isize);

impl<T> CRet for *mut T {
    const FAILURE: Option<Self> = Some(core::ptr::null_mut());
}

impl CRet for () {
    const FAILURE: Option<Self> = None;
}

impl<T: CRet> Outcome<T> {
    /// The one place an outcome becomes a C return value. `pass` performs the real call;
    /// `set_errno` stores an errno (the caller passes the thread's errno setter).
    #[inline(always)]
    pub fn into_ret(self, pass: impl FnOnce() -> T, set_errno: impl FnOnce(Errno)) -> T {
        match self {
            Outcome::Handled(v) => v,
            Outcome::PassThrough => pass(),
            Outcome::Fail(e) => match T::FAILURE {
                Some(fail) => {
                    set_errno(e);
                    fail
                }
                // A function that cannot fail (closefrom): the only sound thing is to do the real
                // call, which is what the caller asked for.
                None => pass(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn conversion() {
        let e = Cell::new(0);
        assert_eq!(Outcome::Handled(5i64).into_ret(|| 9, |x| e.set(x.0)), 5);
        assert_eq!(e.get(), 0);
        assert_eq!(
            Outcome::<i64>::PassThrough.into_ret(|| 9, |x| e.set(x.0)),
            9
        );
        assert_eq!(e.get(), 0);
        assert_eq!(
            Outcome::<i32>::Fail(Errno::EBADF).into_ret(|| 9, |x| e.set(x.0)),
            -1
        );
        assert_eq!(e.get(), libc::EBADF);
        let called = Cell::new(false);
        Outcome::<()>::Fail(Errno::EIO).into_ret(|| called.set(true), |_| unreachable!());
        assert!(called.get());
    }

    #[test]
    fn errors_in_glibcs_words() {
        // Every entry of the table says what the C library says (std asks strerror_r, in the
        // C locale a Rust program starts in): a typo or a wrong number fails here.
        let mut known = 0;
        for n in 1..200 {
            let e = Errno(n);
            let Some(w) = e.words() else { continue };
            known += 1;
            let libc_says = std::io::Error::from_raw_os_error(n).to_string();
            assert_eq!(libc_says, format!("{w} (os error {n})"), "errno {n}");
            assert_eq!(e.to_string(), format!("{w} (errno {n})"));
        }
        assert!(known >= 25, "{known} entries");
        assert_eq!(
            Errno(libc::EACCES).to_string(),
            "Permission denied (errno 13)"
        );
        assert_eq!(Errno(4095).to_string(), "errno 4095");
        assert_eq!(Errno(libc::ECONNRESET).words(), None);
    }
}
