//! The NVMe store: private directory and unlinked 0600 file, pread/pwrite
//! round trips, limits, injected disk-full and I/O errors, shrinking.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use u3m_core::store::nvme::{NvmeConfig, NvmeFaults, NvmeSlot, NvmeStore};
use u3m_core::store::StoreError;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

/// A fresh swap directory under the system temp dir, removed on drop.
struct SwapDir(PathBuf);

impl SwapDir {
    fn new(name: &str) -> SwapDir {
        let p = std::env::temp_dir().join(format!("u3m-store-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        SwapDir(p)
    }
    fn entries(&self) -> Vec<PathBuf> {
        std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect()
    }
}

impl Drop for SwapDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pattern(tag: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| tag.wrapping_mul(31) ^ (i as u8) ^ ((i >> 8) as u8))
        .collect()
}

/// Descriptors of this process whose target lies in `dir`.
fn open_files_in(dir: &Path) -> Vec<(PathBuf, String)> {
    let prefix = format!("{}/", dir.display());
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let fd = e.ok()?.path();
            let target = std::fs::read_link(&fd).ok()?.to_string_lossy().into_owned();
            target.starts_with(&prefix).then_some((fd, target))
        })
        .collect()
}

#[test]
fn private_dir_0700_file_0600_and_unlinked() {
    let sd = SwapDir::new("perm");
    let mut t = NvmeStore::new(&sd.0, 16 * MIB, MIB).unwrap();
    let pd = t.private_dir().to_path_buf();
    assert_eq!(pd.parent(), Some(sd.0.as_path()));
    assert!(pd
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with(&format!("u3m-{}-", std::process::id())));
    let md = std::fs::symlink_metadata(&pd).unwrap();
    assert!(md.is_dir());
    assert_eq!(md.permissions().mode() & 0o7777, 0o700);
    assert_eq!(
        sd.entries(),
        vec![pd.clone()],
        "only the private directory in the swap dir"
    );

    let s = t.alloc(300 * KIB).unwrap();
    t.write(&s, &pattern(1, 300 * KIB as usize)).unwrap();
    assert_eq!(
        std::fs::read_dir(&pd).unwrap().count(),
        0,
        "no entry left in the private dir"
    );

    let open = open_files_in(&pd);
    assert_eq!(open.len(), 1, "one swap file open: {open:?}");
    let (fd, target) = &open[0];
    assert!(
        target.ends_with(" (deleted)"),
        "swap file still linked: {target}"
    );
    let fmd = std::fs::metadata(fd).unwrap(); // follows /proc/self/fd/N to the file
    assert!(fmd.is_file());
    assert_eq!(fmd.permissions().mode() & 0o7777, 0o600);
    assert_eq!(fmd.nlink(), 0);
    assert!(fmd.blocks() * 512 >= MIB, "extent preallocated on disk");
    t.free(s).unwrap();

    drop(t);
    assert!(!pd.exists(), "private dir removed with the store");
    assert!(sd.entries().is_empty());
    assert!(open_files_in(&pd).is_empty(), "descriptor closed");
}

#[test]
fn round_trip_across_extents_and_through_the_mapping() {
    let sd = SwapDir::new("rt");
    let mut t = NvmeStore::new(&sd.0, 16 * MIB, MIB).unwrap();
    let n = 300 * KIB as usize;
    let slots: Vec<NvmeSlot> = (0..10).map(|_| t.alloc(n as u64).unwrap()).collect();
    assert_eq!(
        t.capacity(),
        4 * MIB,
        "three 300 KiB slots per 1 MiB extent"
    );
    for (i, s) in slots.iter().enumerate() {
        t.write(s, &pattern(i as u8, n)).unwrap();
    }
    for (i, s) in slots.iter().enumerate() {
        let mut back = vec![0u8; n];
        t.read(s, &mut back).unwrap();
        assert!(back == pattern(i as u8, n), "slot {i} corrupted");
        assert!(t.host_ptr_safe(s));
        // SAFETY: the slot is live; the mapping is MAP_SHARED over the file.
        let mapped = unsafe { std::slice::from_raw_parts(s.ptr, n) };
        assert!(mapped == back.as_slice(), "mapping disagrees with the file");
    }
    // Writes through the pointer reach the file.
    // SAFETY: live slot, preallocated extent.
    unsafe { std::ptr::write_bytes(slots[3].ptr, 0xab, 100) };
    let mut back = vec![0u8; 100];
    t.read_at(&slots[3], 0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0xab));
    // Partial write at an offset.
    t.write_at(&slots[4], 1000, &[1, 2, 3]).unwrap();
    let mut b3 = [0u8; 3];
    t.read_at(&slots[4], 1000, &mut b3).unwrap();
    assert_eq!(b3, [1, 2, 3]);
    let st = t.stats();
    assert_eq!(st.bytes_written, 10 * n as u64 + 3);
    assert_eq!(st.allocs, 10);
    for s in slots {
        t.free(s).unwrap();
    }
    assert_eq!(t.used(), 0);
}

#[test]
fn limit_gives_full() {
    let sd = SwapDir::new("full");
    let mut t = NvmeStore::new(&sd.0, 2 * MIB, MIB).unwrap();
    assert_eq!(t.alloc(2 * MIB + 1).unwrap_err(), StoreError::Full);
    let a = t.alloc(MIB).unwrap();
    let b = t.alloc(MIB).unwrap();
    assert_eq!(t.alloc(32).unwrap_err(), StoreError::Full);
    assert_eq!(t.capacity(), 2 * MIB);
    t.free(a).unwrap();
    let c = t.alloc(MIB).unwrap();
    t.free(b).unwrap();
    t.free(c).unwrap();
}

#[test]
fn disk_full_on_write_loses_nothing_already_written() {
    let sd = SwapDir::new("enospc");
    let faults = NvmeFaults {
        fail_writes_after_bytes: Some(MIB),
        ..NvmeFaults::default()
    };
    let mut t = NvmeStore::with_config(NvmeConfig {
        faults,
        ..NvmeConfig::new(&sd.0, 16 * MIB, MIB)
    })
    .unwrap();
    let n = 256 * KIB as usize;
    let slots: Vec<NvmeSlot> = (0..5).map(|_| t.alloc(n as u64).unwrap()).collect();
    for (i, s) in slots.iter().enumerate().take(4) {
        t.write(s, &pattern(i as u8, n)).unwrap();
    }
    assert_eq!(t.write(&slots[4], &pattern(4, n)), Err(StoreError::NoSpace));
    assert_eq!(t.stats().io_errors, 1);
    for (i, s) in slots.iter().enumerate().take(4) {
        let mut back = vec![0u8; n];
        t.read(s, &mut back).unwrap();
        assert!(
            back == pattern(i as u8, n),
            "slot {i} damaged by the failed write"
        );
    }
    // The disk "frees up": writing works again.
    t.set_faults(NvmeFaults::default());
    t.write(&slots[4], &pattern(4, n)).unwrap();
    // An EIO instead of ENOSPC is an Io error.
    t.set_faults(NvmeFaults {
        fail_writes_after_bytes: Some(0),
        write_errno: libc::EIO,
        ..NvmeFaults::default()
    });
    assert_eq!(t.write(&slots[0], &[0]), Err(StoreError::Io(libc::EIO)));
    t.set_faults(NvmeFaults {
        fail_read_errno: Some(libc::EIO),
        ..NvmeFaults::default()
    });
    assert_eq!(
        t.read(&slots[0], &mut [0u8; 4]),
        Err(StoreError::Io(libc::EIO))
    );
}

#[test]
fn disk_full_when_growing_leaves_the_store_as_it_was() {
    let sd = SwapDir::new("growfail");
    let mut t = NvmeStore::new(&sd.0, 16 * MIB, MIB).unwrap();
    let a = t.alloc(MIB).unwrap();
    t.write(&a, &pattern(5, MIB as usize)).unwrap();
    t.set_faults(NvmeFaults {
        fail_grow_errno: Some(libc::ENOSPC),
        ..NvmeFaults::default()
    });
    assert_eq!(t.alloc(MIB).unwrap_err(), StoreError::NoSpace);
    t.set_faults(NvmeFaults {
        fail_grow_errno: Some(libc::EIO),
        ..NvmeFaults::default()
    });
    assert_eq!(t.alloc(MIB).unwrap_err(), StoreError::Io(libc::EIO));
    let st = t.stats();
    assert_eq!((st.capacity, st.segments, st.grow_failures), (MIB, 1, 2));
    let (fd, _) = open_files_in(t.private_dir()).pop().unwrap();
    assert_eq!(
        std::fs::metadata(fd).unwrap().len(),
        MIB,
        "file truncated back"
    );
    let mut back = vec![0u8; MIB as usize];
    t.read(&a, &mut back).unwrap();
    assert!(back == pattern(5, MIB as usize));
    t.set_faults(NvmeFaults::default());
    let b = t.alloc(MIB).unwrap();
    assert_eq!(b.off, MIB);
    t.free(a).unwrap();
    t.free(b).unwrap();
}

#[test]
fn bad_slots_are_errors() {
    let sd = SwapDir::new("bad");
    let mut t = NvmeStore::new(&sd.0, 4 * MIB, MIB).unwrap();
    let s = t.alloc(1000).unwrap();
    assert_eq!(
        t.write(&s, &[0u8; 1001]),
        Err(StoreError::BadSlot),
        "longer than the slot"
    );
    assert_eq!(t.write_at(&s, 999, &[0u8; 2]), Err(StoreError::BadSlot));
    assert_eq!(
        t.write_at(&s, u64::MAX, &[0u8; 2]),
        Err(StoreError::BadSlot)
    );
    let copy = NvmeSlot {
        ptr: s.ptr,
        len: s.len,
        extent: s.extent,
        off: s.off,
    };
    let wrong_extent = NvmeSlot {
        ptr: s.ptr,
        len: s.len,
        extent: u3m_core::store::pool::SegmentId(9),
        off: s.off,
    };
    assert_eq!(t.free(wrong_extent), Err(StoreError::BadSlot));
    t.free(s).unwrap();
    assert_eq!(
        t.write(&copy, &[1]),
        Err(StoreError::BadSlot),
        "write to a freed slot"
    );
    assert_eq!(t.read(&copy, &mut [0u8; 1]), Err(StoreError::BadSlot));
    assert_eq!(t.free(copy), Err(StoreError::BadSlot));
}

#[test]
fn shrink_releases_extents_and_space_is_reused() {
    let sd = SwapDir::new("shrink");
    let mut t = NvmeStore::new(&sd.0, 8 * MIB, MIB).unwrap();
    let slots: Vec<NvmeSlot> = (0..4).map(|_| t.alloc(MIB).unwrap()).collect();
    for (i, s) in slots.iter().enumerate() {
        t.write(s, &pattern(i as u8, MIB as usize)).unwrap();
    }
    let mut it = slots.into_iter();
    let (s0, s1, s2, s3) = (
        it.next().unwrap(),
        it.next().unwrap(),
        it.next().unwrap(),
        it.next().unwrap(),
    );
    t.free(s1).unwrap();
    t.free(s3).unwrap();
    assert_eq!(t.shrink(), 2 * MIB);
    let (fd, _) = open_files_in(t.private_dir()).pop().unwrap();
    let md = std::fs::metadata(&fd).unwrap();
    assert_eq!(md.len(), 3 * MIB, "tail extent truncated away");
    assert!(
        md.blocks() * 512 <= 2 * MIB + 64 * KIB,
        "middle extent hole-punched: {} blocks",
        md.blocks()
    );
    assert_eq!(t.capacity(), 2 * MIB);
    // The hole in the middle is reused before the file grows.
    let s4 = t.alloc(MIB).unwrap();
    assert_eq!(s4.off, MIB);
    t.write(&s4, &pattern(9, MIB as usize)).unwrap();
    for (s, tag) in [(&s0, 0u8), (&s2, 2), (&s4, 9)] {
        let mut back = vec![0u8; MIB as usize];
        t.read(s, &mut back).unwrap();
        assert!(back == pattern(tag, MIB as usize), "tag {tag}");
    }
    let st = t.stats();
    assert_eq!((st.grows, st.releases), (5, 2));
    for s in [s0, s2, s4] {
        t.free(s).unwrap();
    }
    assert_eq!(t.shrink(), 3 * MIB);
    assert_eq!(std::fs::metadata(&fd).unwrap().len(), 0);
}

#[test]
fn unusable_directories_are_named_in_the_error() {
    let sd = SwapDir::new("errs");
    let missing = sd.0.join("nope");
    let e = NvmeStore::new(&missing, MIB, MIB).err().unwrap();
    assert_eq!(
        e,
        StoreError::SwapDir {
            dir: missing.clone(),
            what: "does not exist".into()
        }
    );
    assert!(e.to_string().contains(missing.to_str().unwrap()));

    let file = sd.0.join("file");
    std::fs::write(&file, b"x").unwrap();
    let e = NvmeStore::new(&file, MIB, MIB).err().unwrap();
    assert_eq!(
        e,
        StoreError::SwapDir {
            dir: file.clone(),
            what: "is not a directory".into()
        }
    );

    // Root ignores mode bits, so use a directory the kernel refuses.
    // SAFETY: geteuid has no preconditions.
    let ro = if unsafe { libc::geteuid() } == 0 {
        PathBuf::from("/sys")
    } else {
        let d = sd.0.join("ro");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o500)).unwrap();
        d
    };
    match NvmeStore::new(&ro, MIB, MIB).err().unwrap() {
        StoreError::SwapDir { dir, what } => {
            assert_eq!(dir, ro);
            assert!(
                what.contains("not writable") || what.contains("cannot create"),
                "{what}"
            );
        }
        e => panic!("unexpected {e:?}"),
    }
}

#[test]
fn stale_empty_private_dirs_are_removed() {
    let sd = SwapDir::new("stale");
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let empty = sd.0.join(format!("u3m-{dead}-aaaaaa"));
    let full = sd.0.join(format!("u3m-{dead}-bbbbbb"));
    let mine = sd.0.join(format!("u3m-{}-cccccc", std::process::id()));
    for d in [&empty, &full, &mine] {
        std::fs::create_dir(d).unwrap();
    }
    std::fs::write(full.join("keep"), b"x").unwrap();
    let t = NvmeStore::new(&sd.0, MIB, MIB).unwrap();
    assert!(!empty.exists(), "empty dir of a dead process removed");
    assert!(full.exists(), "non-empty dir left alone");
    assert!(mine.exists(), "dir of a live process left alone");
    drop(t);
}

#[test]
fn store_and_slots_are_send() {
    fn send<T: Send>() {}
    send::<NvmeStore>();
    send::<NvmeSlot>();
}

/// Figures for the report: `cargo test --release -p u3m-core --test store_nvme
/// -- --ignored --nocapture`.
#[test]
#[ignore]
fn nvme_timing() {
    use std::time::Instant;
    let sd = SwapDir::new("timing");
    let mut t = NvmeStore::new(&sd.0, 2 << 30, 256 * MIB).unwrap();
    let t0 = Instant::now();
    let first = t.alloc(2 * MIB).unwrap();
    let grow = t0.elapsed();
    let mut live = vec![first];
    let (mut ta, mut tf, n) = (0u128, 0u128, 20_000u32);
    for i in 0..n {
        let t0 = Instant::now();
        live.push(t.alloc(2 * MIB).unwrap());
        ta += t0.elapsed().as_nanos();
        if i % 2 == 1 || live.len() > 100 {
            let s = live.swap_remove(i as usize % live.len());
            let t0 = Instant::now();
            t.free(s).unwrap();
            tf += t0.elapsed().as_nanos();
        }
    }
    let buf = pattern(3, 2 * MIB as usize);
    let mut back = vec![0u8; 2 * MIB as usize];
    let t0 = Instant::now();
    for s in &live {
        t.write(s, &buf).unwrap();
    }
    let w = t0.elapsed();
    let t0 = Instant::now();
    for s in &live {
        t.write(s, &buf).unwrap();
    }
    let w2 = t0.elapsed();
    let t0 = Instant::now();
    for s in &live {
        t.read(s, &mut back).unwrap();
    }
    let r = t0.elapsed();
    let bytes = (live.len() as u64 * 2 * MIB) as f64;
    println!(
        "nvme: first 256 MiB extent (ftruncate+fallocate+mmap) {:?}; alloc {:.0} ns, free {:.0} ns; \
         pwrite {:.2} GB/s first / {:.2} GB/s again, pread {:.2} GB/s ({} MiB, page cache)",
        grow,
        ta as f64 / n as f64,
        tf as f64 / (n / 2) as f64,
        bytes / w.as_secs_f64() / 1e9,
        bytes / w2.as_secs_f64() / 1e9,
        bytes / r.as_secs_f64() / 1e9,
        bytes as u64 / MIB
    );
}
