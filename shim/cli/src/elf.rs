//! Just enough of ELF to answer the launcher's questions about a file without loading it
//! (loading a shared object runs its constructors): its type, its program headers, its
//! section names, and whether its dynamic symbol table defines a name.
//!
//! References: the System V gABI, "Object Files" (ELF header, sections, symbol table,
//! program header); elf(5).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

pub const PT_INTERP: u32 = 3;
pub const ET_EXEC: u16 = 2;
pub const ET_DYN: u16 = 3;
const SHT_DYNSYM: u32 = 11;
const SHN_UNDEF: u16 = 0;

/// Reads `len` bytes at `off` (`None` past the end, or for an absurd size).
fn read_at(f: &mut File, off: u64, len: usize) -> Option<Vec<u8>> {
    if len > 16 << 20 {
        return None;
    }
    f.seek(SeekFrom::Start(off)).ok()?;
    let mut v = vec![0u8; len];
    f.read_exact(&mut v).ok()?;
    Some(v)
}

/// Field readers for a little- or big-endian ELF of class 64 (`wide`) or 32.
#[derive(Clone, Copy)]
struct Layout {
    little: bool,
    wide: bool,
}

impl Layout {
    /// The unsigned integer of `len` bytes at `at` in the file's byte order.
    fn int(&self, b: &[u8], at: usize, len: usize) -> Option<u64> {
        let bytes = b.get(at..at.checked_add(len)?)?;
        let push = |v: u64, x: &u8| v << 8 | u64::from(*x);
        Some(if self.little {
            bytes.iter().rev().fold(0, push)
        } else {
            bytes.iter().fold(0, push)
        })
    }
    fn u16(&self, b: &[u8], at: usize) -> Option<u16> {
        self.int(b, at, 2).map(|v| v as u16)
    }
    fn u32(&self, b: &[u8], at: usize) -> Option<u32> {
        self.int(b, at, 4).map(|v| v as u32)
    }
    /// An address or offset: 8 bytes in class 64, 4 in class 32.
    fn word(&self, b: &[u8], at: usize) -> Option<u64> {
        self.int(b, at, if self.wide { 8 } else { 4 })
    }
    /// `w` in class 64, `n` in class 32 (a field's offset).
    fn at(&self, w: usize, n: usize) -> usize {
        if self.wide {
            w
        } else {
            n
        }
    }
}

/// One section header, with its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    pub name: Vec<u8>,
    pub kind: u32,
    pub offset: u64,
    pub size: u64,
    pub link: u32,
}

/// An open ELF file, its header read.
pub struct Elf {
    file: File,
    l: Layout,
    /// `e_type`: [`ET_EXEC`], [`ET_DYN`], ...
    pub kind: u16,
    phoff: u64,
    phentsize: usize,
    phnum: usize,
    shoff: u64,
    shentsize: usize,
    shnum: usize,
    shstrndx: usize,
}

impl Elf {
    /// Reads the ELF header of `file`; `None` if it is not ELF (or is cut short).
    pub fn read(mut file: File) -> Option<Elf> {
        let eh = read_at(&mut file, 0, 64)?;
        if eh.get(..4)? != b"\x7fELF" {
            return None;
        }
        let wide = match eh[4] {
            1 => false,
            2 => true,
            _ => return None,
        };
        let little = match eh[5] {
            1 => true,
            2 => false,
            _ => return None,
        };
        let l = Layout { little, wide };
        Some(Elf {
            kind: l.u16(&eh, 16)?,
            phoff: l.word(&eh, l.at(32, 28))?,
            shoff: l.word(&eh, l.at(40, 32))?,
            phentsize: usize::from(l.u16(&eh, l.at(54, 42))?),
            phnum: usize::from(l.u16(&eh, l.at(56, 44))?),
            shentsize: usize::from(l.u16(&eh, l.at(58, 46))?),
            shnum: usize::from(l.u16(&eh, l.at(60, 48))?),
            shstrndx: usize::from(l.u16(&eh, l.at(62, 50))?),
            file,
            l,
        })
    }

    /// Whether a program header of type `ty` is there; `None` if they cannot be read.
    pub fn has_program_header(&mut self, ty: u32) -> Option<bool> {
        if self.phentsize < 4 {
            return None;
        }
        let len = self.phentsize.checked_mul(self.phnum)?;
        let ph = read_at(&mut self.file, self.phoff, len)?;
        Some((0..self.phnum).any(|i| self.l.u32(&ph, i * self.phentsize) == Some(ty)))
    }

    /// The section headers, named; empty if the file has none; `None` if they cannot be read.
    pub fn sections(&mut self) -> Option<Vec<Section>> {
        let l = self.l;
        let (n, size) = (self.shnum, self.shentsize);
        if self.shoff == 0 || n == 0 || self.shstrndx >= n || size < l.at(64, 40) {
            return Some(vec![]);
        }
        let sh = read_at(&mut self.file, self.shoff, size.checked_mul(n)?)?;
        let raw = |i: usize| -> Option<(u32, Section)> {
            let b = sh.get(i * size..(i + 1) * size)?;
            let name_at = l.u32(b, 0)?;
            Some((
                name_at,
                Section {
                    name: vec![],
                    kind: l.u32(b, 4)?,
                    offset: l.word(b, l.at(24, 16))?,
                    size: l.word(b, l.at(32, 20))?,
                    link: l.u32(b, l.at(40, 24))?,
                },
            ))
        };
        let (_, strtab) = raw(self.shstrndx)?;
        let names = self.contents(&strtab)?;
        (0..n)
            .map(|i| {
                let (name_at, mut s) = raw(i)?;
                s.name = c_string(&names, name_at as usize).to_vec();
                Some(s)
            })
            .collect()
    }

    /// Whether the dynamic symbol table (`.dynsym`) defines `name` (a symbol of that name
    /// that is not undefined); `None` if the file has no readable dynamic symbol table.
    pub fn defines(&mut self, name: &[u8]) -> Option<bool> {
        let sections = self.sections()?;
        let dynsym = sections.iter().find(|s| s.kind == SHT_DYNSYM)?;
        let strtab = sections.get(usize::try_from(dynsym.link).ok()?)?;
        let syms = self.contents(dynsym)?;
        let strs = self.contents(strtab)?;
        let (entsize, shndx_at) = if self.l.wide { (24, 6) } else { (16, 14) };
        Some(syms.chunks_exact(entsize).any(|sym| {
            let defined = self.l.u16(sym, shndx_at).is_some_and(|s| s != SHN_UNDEF);
            let at = self.l.u32(sym, 0).unwrap_or(0) as usize;
            defined && c_string(&strs, at) == name
        }))
    }

    fn contents(&mut self, s: &Section) -> Option<Vec<u8>> {
        read_at(&mut self.file, s.offset, usize::try_from(s.size).ok()?)
    }
}

/// The NUL-terminated string at `at` in a string table (empty outside it).
fn c_string(table: &[u8], at: usize) -> &[u8] {
    table
        .get(at..)
        .and_then(|s| s.split(|b| *b == 0).next())
        .unwrap_or_default()
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use std::path::Path;

    /// A minimal 64-bit little-endian ELF of type `kind`: one program header of type `pt`,
    /// and section headers naming `sections` (after the null section and .shstrtab); a
    /// `.dynsym` among them gets a symbol table defining `symbols` (its strings in the
    /// section after it, which must be `.dynstr`).
    pub fn elf(kind: u16, pt: u32, sections: &[&str], symbols: &[&str]) -> Vec<u8> {
        let mut names = vec![0u8];
        let mut name_at = vec![];
        for n in std::iter::once(".shstrtab").chain(sections.iter().copied()) {
            name_at.push(names.len() as u32);
            names.extend_from_slice(n.as_bytes());
            names.push(0);
        }
        let mut dynstr = vec![0u8];
        let mut dynsym = vec![0u8; 24]; // the null symbol
        for s in symbols {
            let mut sym = vec![0u8; 24];
            sym[..4].copy_from_slice(&(dynstr.len() as u32).to_le_bytes());
            sym[6..8].copy_from_slice(&1u16.to_le_bytes()); // defined (in section 1)
            dynsym.extend_from_slice(&sym);
            dynstr.extend_from_slice(s.as_bytes());
            dynstr.push(0);
        }
        let phoff = 64u64;
        let names_off = phoff + 56;
        let dynsym_off = names_off + names.len() as u64;
        let dynstr_off = dynsym_off + dynsym.len() as u64;
        let shoff = dynstr_off + dynstr.len() as u64;
        let shnum = 2 + sections.len();
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[6] = 1;
        b[16..18].copy_from_slice(&kind.to_le_bytes());
        b[32..40].copy_from_slice(&phoff.to_le_bytes());
        b[40..48].copy_from_slice(&shoff.to_le_bytes());
        b[54..56].copy_from_slice(&56u16.to_le_bytes());
        b[56..58].copy_from_slice(&1u16.to_le_bytes());
        b[58..60].copy_from_slice(&64u16.to_le_bytes());
        b[60..62].copy_from_slice(&(shnum as u16).to_le_bytes());
        b[62..64].copy_from_slice(&1u16.to_le_bytes());
        let mut ph = vec![0u8; 56];
        ph[..4].copy_from_slice(&pt.to_le_bytes());
        b.extend_from_slice(&ph);
        b.extend_from_slice(&names);
        b.extend_from_slice(&dynsym);
        b.extend_from_slice(&dynstr);
        b.extend_from_slice(&[0u8; 64]); // the null section
        for (i, at) in name_at.iter().enumerate() {
            let mut sh = vec![0u8; 64];
            sh[..4].copy_from_slice(&at.to_le_bytes());
            let (kind, off, len, link) = match (i, sections.get(i.wrapping_sub(1))) {
                (0, _) => (3, names_off, names.len(), 0),
                (_, Some(&".dynsym")) => (SHT_DYNSYM, dynsym_off, dynsym.len(), i + 2),
                (_, Some(&".dynstr")) => (3, dynstr_off, dynstr.len(), 0),
                _ => (1, 0, 0, 0),
            };
            sh[4..8].copy_from_slice(&kind.to_le_bytes());
            sh[24..32].copy_from_slice(&off.to_le_bytes());
            sh[32..40].copy_from_slice(&(len as u64).to_le_bytes());
            sh[40..44].copy_from_slice(&(link as u32).to_le_bytes());
            b.extend_from_slice(&sh);
        }
        b
    }

    fn open(bytes: &[u8]) -> Option<Elf> {
        let p = std::env::temp_dir().join(format!(
            "rdmashim-elf-{}-{}",
            std::process::id(),
            bytes.len()
        ));
        std::fs::write(&p, bytes).unwrap();
        let f = File::open(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        Elf::read(f)
    }

    #[test]
    fn header_sections_and_symbols() {
        let b = elf(
            ET_DYN,
            1,
            &[".text", ".dynsym", ".dynstr"],
            &["socket", "rdmashim_x"],
        );
        let mut e = open(&b).unwrap();
        assert_eq!(e.kind, ET_DYN);
        assert_eq!(e.has_program_header(PT_INTERP), Some(false));
        assert_eq!(e.has_program_header(1), Some(true));
        let names: Vec<_> = e.sections().unwrap().into_iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [&b""[..], b".shstrtab", b".text", b".dynsym", b".dynstr"]
        );
        assert_eq!(e.defines(b"rdmashim_x"), Some(true));
        assert_eq!(e.defines(b"socket"), Some(true));
        assert_eq!(e.defines(b"rdmashim"), Some(false));
        assert_eq!(e.defines(b""), Some(false), "the null symbol is undefined");
        // No .dynsym: no answer.
        let mut plain = open(&elf(ET_DYN, 1, &[".text"], &[])).unwrap();
        assert_eq!(plain.defines(b"socket"), None);
        // Not ELF, or cut inside the header.
        assert!(open(b"hello, world").is_none());
        assert!(open(&b[..40]).is_none());
    }

    #[test]
    fn a_real_shared_object() {
        // (the libc this test runs with: it defines socket)
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| Path::new(p).file_name().is_some_and(|n| n == "libc.so.6"))
            .expect("libc.so.6 not mapped");
        let mut e = Elf::read(File::open(libc).unwrap()).unwrap();
        assert_eq!(e.kind, ET_DYN);
        assert_eq!(e.defines(b"socket"), Some(true));
        assert_eq!(e.defines(b"no_such_symbol_in_libc"), Some(false));
    }
}
