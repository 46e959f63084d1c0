//! Calls larger than HBM. The invariant: no call runs on device memory u3m
//! has not made accessible. A call whose chunks cannot all be resident at
//! once is refused in `prepare`, before anything is queued or moved, with
//! 207001; the engine says so in one line naming the call.

use std::sync::atomic::Ordering::Relaxed;

use super::state::State;
use super::Residency;
use crate::engine::runtime::CHUNK;

/// A call refused because its memory cannot all be accessible at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Oversize {
    pub dev: u32,
    /// Bytes of managed memory the call touches on `dev` (whole chunks).
    pub need: u64,
    /// The device's HBM, and what managed memory can hold of it now
    /// (free plus what is resident: memory u3m does not manage stays).
    pub hbm: u64,
    pub room: u64,
}

impl Residency {
    /// Whether the chunks a call touches on `dev` can be resident together.
    /// Asks the runtime (the calling thread's device is `dev`); on an error
    /// the fault-in decides as before.
    pub(super) fn check_fits(
        &self,
        st: &State,
        dev: u32,
        chunks: &[(u64, u32)],
    ) -> Result<(), Oversize> {
        let need = chunks
            .iter()
            .filter(|c| st.backings.get(&c.0).map(|b| b.dev) == Some(dev))
            .count() as u64
            * CHUNK;
        let Ok((free, hbm)) = self.rt.mem_info() else {
            return Ok(());
        };
        let room = free.saturating_add(st.dev(dev).resident);
        if need <= room {
            return Ok(());
        }
        Err(Oversize {
            dev,
            need,
            hbm,
            room,
        })
    }

    /// Counts a refused call and keeps its figures for the engine.
    pub(super) fn refuse_oversize(&self, o: Oversize) {
        self.c.refused_oversize.fetch_add(1, Relaxed);
        if let Ok(mut g) = self.oversize.lock() {
            *g = Some(o);
        }
    }

    /// The figures of the call `prepare` last refused as too large, once.
    pub fn take_oversize(&self) -> Option<Oversize> {
        self.oversize.lock().ok()?.take()
    }
}
