//! Card failure: a device that disappeared with its HBM. Chunks whose only
//! current copy was there are lost; the rest stay readable from DRAM/NVMe.

use std::sync::atomic::Ordering::Relaxed;

use super::state::{handle_of, Host};
use super::{Shard as Residency, E_DEVICE_LOST};
use crate::acl::AclError;
use crate::engine::runtime::CHUNK;
use crate::store::StoreError;

/// Managed allocations as (device VA or handle, bytes).
pub type Allocations = Vec<(u64, u64)>;

impl Residency {
    /// Whether any device has been lost (the copy path's fast check).
    #[inline]
    pub fn any_lost(&self) -> bool {
        self.lost_any.load(Relaxed)
    }

    /// Card failure: `dev` disappeared with its HBM. Chunks whose current
    /// data was only there are lost; chunks with a current copy in DRAM or
    /// on NVMe stay readable through `read_lost`. Returns (lost, readable)
    /// managed allocations, or None when the device was already known lost.
    /// Nothing on `dev` is called again.
    pub fn device_lost(&self, dev: u32) -> Option<(Allocations, Allocations)> {
        let mut st = self.st.lock().ok()?;
        if st.dev(dev).lost {
            return None;
        }
        st.dev_mut(dev).lost = true;
        st.structure += 1;
        self.lost_any.store(true, Relaxed);
        st.dev_mut(dev).resident = 0;
        // moves' old memory went with the device
        self.forget_moves(&mut st, dev);
        let (mut lost, mut kept) = (Vec::new(), Vec::new());
        let mut ids: Vec<u64> = st
            .backings
            .iter()
            .filter(|(_, b)| b.dev == dev)
            .map(|(&id, _)| id)
            .collect();
        ids.sort_unstable();
        for id in ids {
            let st2 = &mut *st;
            let b = st2.backings.get_mut(&id).expect("backing");
            let mut any_lost = false;
            for c in b.chunks.iter_mut() {
                if c.phys != 0 {
                    if c.needs_copy_out() {
                        c.lost = true;
                        any_lost = true;
                        // a stale host copy must never be served as current
                        if let Some(h) = c.host.take() {
                            st2.pending_free.push((dev, h));
                        }
                    }
                    c.phys = 0; // gone with the device: never freed or unmapped
                    c.on_host = false;
                    c.dirty = false;
                } else if c.out_ev != 0 {
                    // its HBM was taken before its copy-out landed
                    // (`take_outgoing`): its data went with the device
                    c.lost = true;
                    any_lost = true;
                }
                c.uses.clear();
                c.pins = 0;
            }
            let b = &st.backings[&id];
            let name = b.vas.first().copied().unwrap_or(handle_of(id));
            if any_lost {
                lost.push((name, b.size));
            } else {
                kept.push((name, b.size));
            }
        }
        // host slots of lost chunks: nothing of ours runs on the lost device
        for (_, h) in std::mem::take(&mut st.pending_free) {
            st.free_host(h);
        }
        for (ev, _, h) in std::mem::take(&mut st.fenced_free) {
            st.free_host(h);
            st.unref_event(ev);
        }
        Some((lost, kept))
    }

    /// A device-to-host read of `len` bytes at device address `src` into
    /// `dst` for a device that has disappeared: served from the host copies.
    /// None: `src` is not managed memory of a lost device (the caller does
    /// the real copy). Some(Err(E_DEVICE_LOST)): part of the range was lost.
    ///
    /// # Safety
    /// `dst` must be valid for `len` bytes of writes.
    pub unsafe fn read_lost(
        &self,
        src: u64,
        dst: *mut u8,
        len: u64,
    ) -> Option<Result<(), AclError>> {
        let mut st = self.st.lock().ok()?;
        let (&start, &(id, size)) = st.vas.range(..=src).next_back()?;
        if src >= start + size {
            return None;
        }
        let b = st.backings.get(&id)?;
        if !st.dev(b.dev).lost {
            return None;
        }
        if dst.is_null() || src + len > start + size {
            return Some(Err(E_DEVICE_LOST));
        }
        let off = src - start;
        let mut done = 0u64;
        while done < len {
            let at = off + done;
            let i = (at / CHUNK) as usize;
            let within = at % CHUNK;
            let n = (CHUNK - within).min(len - done);
            let out = std::slice::from_raw_parts_mut(dst.add(done as usize), n as usize);
            let st2 = &mut *st;
            let c = &st2.backings[&id].chunks[i];
            if c.lost {
                return Some(Err(E_DEVICE_LOST));
            }
            match &c.host {
                None => out.fill(0), // never written: fresh memory reads as zeros
                Some(Host::Dram(slot)) => std::ptr::copy_nonoverlapping(
                    slot.ptr.add(within as usize),
                    out.as_mut_ptr(),
                    n as usize,
                ),
                Some(Host::Nvme(slot)) => {
                    let r = st2
                        .nvme
                        .as_mut()
                        .map(|nv| nv.read_at(slot, within, out))
                        .unwrap_or(Err(StoreError::BadSlot));
                    if r.is_err() {
                        self.c.spill_errors.fetch_add(1, Relaxed);
                        return Some(Err(E_DEVICE_LOST));
                    }
                }
            }
            done += n;
        }
        Some(Ok(()))
    }
}
