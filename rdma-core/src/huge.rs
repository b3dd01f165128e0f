//! The host's huge pages, as `/proc/meminfo` has them: what [`crate::ring`] makes rings of
//! where it can, and what `rdmashim doctor` reports (the launcher compiles this file too).
#![forbid(unsafe_code)]

/// The host's default huge pages, as `/proc/meminfo` has them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HugePages {
    /// Bytes per huge page (`Hugepagesize`).
    pub size: usize,
    /// Pages of the pool in all (`HugePages_Total`).
    pub total: u64,
    /// Pages free and not promised to a mapping already made (`HugePages_Free` less
    /// `HugePages_Rsvd`): what a new ring may take.
    pub available: u64,
}

impl HugePages {
    /// Reads the host's figures; `None` where the kernel has no huge pages.
    pub fn read() -> Option<HugePages> {
        Self::parse(&std::fs::read_to_string("/proc/meminfo").ok()?)
    }

    /// [`Self::read`] from the text of `/proc/meminfo`.
    pub fn parse(meminfo: &str) -> Option<HugePages> {
        let field = |name: &str| -> Option<u64> {
            let line = meminfo.lines().find(|l| l.starts_with(name))?;
            line[name.len()..].split_whitespace().next()?.parse().ok()
        };
        let kib = field("Hugepagesize:")?;
        let free = field("HugePages_Free:")?;
        Some(HugePages {
            size: usize::try_from(kib).ok()?.checked_mul(1024)?,
            total: field("HugePages_Total:")?,
            available: free.saturating_sub(field("HugePages_Rsvd:").unwrap_or(0)),
        })
    }

    /// Whether a ring of `size` bytes would be made of these pages now: a multiple of their
    /// size, and as many free.
    pub fn fit(&self, size: usize) -> bool {
        self.size > 0
            && size.is_multiple_of(self.size)
            && (size / self.size) as u64 <= self.available
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_pages_are_read_from_meminfo() {
        let meminfo = "MemTotal:       24000000 kB\nHugePages_Total:      16\n\
                       HugePages_Free:       12\nHugePages_Rsvd:        4\n\
                       HugePages_Surp:        0\nHugepagesize:       2048 kB\n";
        let hp = HugePages::parse(meminfo).unwrap();
        assert_eq!(
            hp,
            HugePages {
                size: 2 << 20,
                total: 16,
                available: 8
            }
        );
        assert!(hp.fit(16 << 20), "8 pages free and not promised");
        assert!(!hp.fit(32 << 20), "only 8 available");
        assert!(!hp.fit(1 << 20), "not a multiple of the huge page");
        assert!(HugePages::parse("MemTotal: 1 kB\n").is_none());
        let none = HugePages::parse(
            "HugePages_Total: 0\nHugePages_Free: 0\nHugePages_Rsvd: 0\nHugepagesize: 2048 kB\n",
        )
        .unwrap();
        assert!(!none.fit(2 << 20));
    }
}
