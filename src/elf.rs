//! Finds glibc's own `dlsym`/`dlvsym` by reading the dynamic symbol tables of
//! the loaded objects (dl_iterate_phdr). u3m exports `dlsym` and `dlvsym`
//! itself, so it cannot look them up by name through either — and a versioned
//! reference would bind to u3m's unversioned export. Runs once, at start-up.

use std::ffi::c_void;
use std::os::raw::c_int;

#[cfg(target_pointer_width = "64")]
mod elf_types {
    pub type Phdr = libc::Elf64_Phdr;
    #[repr(C)]
    pub struct Dyn {
        pub d_tag: i64,
        pub d_val: u64,
    }
    #[repr(C)]
    pub struct Sym {
        pub st_name: u32,
        pub st_info: u8,
        pub st_other: u8,
        pub st_shndx: u16,
        pub st_value: u64,
        pub st_size: u64,
    }
}
use elf_types::*;

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
const STT_FUNC: u8 = 2;

struct Search {
    name: &'static [u8],
    skip: usize, // an address inside the object to skip (u3m itself)
    found: usize,
}

fn contains(info: &libc::dl_phdr_info, addr: usize) -> bool {
    // SAFETY: dl_iterate_phdr hands `info` with `dlpi_phnum` program
    // headers at `dlpi_phdr`, valid for the callback's duration.
    let phdrs = unsafe {
        std::slice::from_raw_parts(info.dlpi_phdr as *const Phdr, info.dlpi_phnum as usize)
    };
    phdrs.iter().any(|p| {
        let start = info.dlpi_addr as usize + p.p_vaddr as usize;
        p.p_type == PT_LOAD && addr >= start && addr < start + p.p_memsz as usize
    })
}

/// Number of symbols in a GNU hash table: the highest index reached from any
/// bucket, walked to the end of its chain.
///
/// # Safety
/// `gh` points at a loaded object's DT_GNU_HASH table (header, bloom
/// words, buckets, chains), mapped readable by the dynamic loader.
unsafe fn gnu_hash_nsyms(gh: *const u32) -> usize {
    let nbuckets = *gh as usize;
    let symoffset = *gh.add(1) as usize;
    let bloom_size = *gh.add(2) as usize;
    let bloom = gh.add(4) as *const usize;
    let buckets = bloom.add(bloom_size) as *const u32;
    let chain = buckets.add(nbuckets);
    let mut last = 0usize;
    for b in 0..nbuckets {
        let v = *buckets.add(b) as usize;
        if v > last {
            last = v;
        }
    }
    if last < symoffset {
        return symoffset;
    }
    while *chain.add(last - symoffset) & 1 == 0 {
        last += 1;
    }
    last + 1
}

/// dl_iterate_phdr's callback.
///
/// # Safety
/// `info` is the loader's description of one loaded object and `data` the
/// `Search` passed by `find_function`; both live for the call. The dynamic
/// section's tables it reads are mapped by the loader (relocated pointers,
/// or offsets from the base in the vDSO).
unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    let s = &mut *(data as *mut Search);
    let info = &*info;
    if contains(info, s.skip) {
        return 0;
    }
    let base = info.dlpi_addr as usize;
    let phdrs = std::slice::from_raw_parts(info.dlpi_phdr as *const Phdr, info.dlpi_phnum as usize);
    let Some(dynamic) = phdrs.iter().find(|p| p.p_type == PT_DYNAMIC) else {
        return 0;
    };
    let mut d = (base + dynamic.p_vaddr as usize) as *const Dyn;
    let (mut symtab, mut strtab, mut hash, mut gnu_hash, mut versym) =
        (0usize, 0usize, 0usize, 0usize, 0usize);
    // ld.so relocates these pointers in place on most targets; not in the vDSO
    let fix = |v: u64| -> usize {
        if (v as usize) < base {
            base + v as usize
        } else {
            v as usize
        }
    };
    while (*d).d_tag != DT_NULL {
        match (*d).d_tag {
            DT_SYMTAB => symtab = fix((*d).d_val),
            DT_STRTAB => strtab = fix((*d).d_val),
            DT_HASH => hash = fix((*d).d_val),
            DT_GNU_HASH => gnu_hash = fix((*d).d_val),
            DT_VERSYM => versym = fix((*d).d_val),
            _ => {}
        }
        d = d.add(1);
    }
    if symtab == 0 || strtab == 0 {
        return 0;
    }
    let nsyms = if hash != 0 {
        *(hash as *const u32).add(1) as usize
    } else if gnu_hash != 0 {
        gnu_hash_nsyms(gnu_hash as *const u32)
    } else {
        return 0;
    };
    let syms = symtab as *const Sym;
    for i in 0..nsyms {
        let sym = &*syms.add(i);
        let ty = sym.st_info & 0xf;
        if sym.st_shndx == 0 || sym.st_value == 0 || ty != STT_FUNC {
            continue;
        }
        // the default version only (dlsym@@GLIBC_2.34, not dlsym@GLIBC_2.2.5)
        if versym != 0 && *(versym as *const u16).add(i) & 0x8000 != 0 {
            continue;
        }
        let name = std::ffi::CStr::from_ptr((strtab + sym.st_name as usize) as *const libc::c_char);
        if name.to_bytes() == s.name {
            s.found = base + sym.st_value as usize;
            return 1;
        }
    }
    0
}

/// Address of the default-version definition of `name` in the first loaded
/// object other than the one containing `skip`, or null.
pub fn find_function(name: &'static [u8], skip: usize) -> *mut c_void {
    let mut s = Search {
        name,
        skip,
        found: 0,
    };
    // SAFETY: `visit` matches the callback type and treats `data` as the
    // `Search` passed here, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut s as *mut Search as *mut c_void) };
    s.found as *mut c_void
}
