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
}
