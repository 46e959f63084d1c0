//! Which direction of the link u3m's copies load, and what eviction does
//! about it (U3M_OUT_FIRST).
//!
//! Evicting a clean chunk costs the copy-in that brings it back; evicting
//! a dirty chunk whose next use (as the policy predicts it) writes it whole
//! costs its copy-out alone — the data is most likely dead (an activation
//! or gradient buffer the framework's caching allocator hands out again),
//! but u3m was not told so and must keep it. The two directions of the
//! link run at the same rate, each on its own. Where u3m's copy-ins load
//! the host-to-device direction and the device-to-host one idles, taking
//! such dirty chunks before clean ones spends the idle direction and
//! spares copy-ins (`Placement::set_out_slack`); where the copy-outs are
//! the load already (full-parameter AdamW) it would only add to them.
//!
//! `off` is the default: taking dirty chunks first moves more bytes in all
//! (the full-scale 13B LoRA trace: 1.184 x Belady's against 1.107), and
//! the replay's proof holds every trace to 1.15 x. `auto` decides once
//! from u3m's own byte counters: on when the copy-ins
//! have outrun the copy-outs by `LEAD` since start (the first step evicts
//! before anything repeats, which is copy-outs); off again for good if,
//! over the next `TRIAL` bytes, the copy-outs come to more than twice the
//! copy-ins. Switching back and forth was measured worse than either
//! regime (BENCHMARKS.md: a balance kept within a window or by hysteresis
//! mixes the two and leaves both directions under-used).

pub use crate::config::OutFirst;

/// Copy-in bytes ahead of copy-out bytes that turn `auto` on.
pub const LEAD: u64 = 1 << 30;
/// Bytes of copies after turning on over which `auto` checks the result.
pub const TRIAL: u64 = 8 << 30;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Watching,
    /// On since the counters read (in, out).
    On {
        in0: u64,
        out0: u64,
    },
    /// Off for good.
    Done,
}

/// The decision for one device's victim order (`VictimOrder::balance`).
#[derive(Clone, Copy, Debug)]
pub struct Balance {
    stage: Stage,
}

impl Balance {
    pub const fn new() -> Balance {
        Balance {
            stage: Stage::Watching,
        }
    }

    /// Whether dirty chunks written whole next go first, given the mode and
    /// u3m's copy counters so far: bytes copied in (demand and prefetch)
    /// and out.
    pub fn out_first(&mut self, mode: OutFirst, total_in: u64, total_out: u64) -> bool {
        match mode {
            OutFirst::On => return true,
            OutFirst::Off => return false,
            OutFirst::Auto => {}
        }
        match self.stage {
            Stage::Watching if total_in > total_out.saturating_add(LEAD) => {
                self.stage = Stage::On {
                    in0: total_in,
                    out0: total_out,
                };
                true
            }
            Stage::Watching | Stage::Done => false,
            Stage::On { in0, out0 } => {
                let (di, dout) = (total_in.saturating_sub(in0), total_out.saturating_sub(out0));
                if di.saturating_add(dout) >= TRIAL && dout > di.saturating_mul(2) {
                    self.stage = Stage::Done;
                    return false;
                }
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    #[test]
    fn on_and_off_say_so_whatever_the_counters() {
        let mut b = Balance::new();
        assert!(b.out_first(OutFirst::On, 0, 100 * G));
        assert!(!b.out_first(OutFirst::Off, 100 * G, 0));
    }

    #[test]
    fn auto_turns_on_once_copy_ins_lead_and_stays_on_while_copy_outs_stay_moderate() {
        let mut b = Balance::new();
        // the first step: copy-outs ahead
        assert!(!b.out_first(OutFirst::Auto, 2 * G, 3 * G));
        // copy-ins catch up, but not by LEAD yet
        assert!(!b.out_first(OutFirst::Auto, 4 * G, 3 * G + 1));
        assert!(b.out_first(OutFirst::Auto, 5 * G, 3 * G));
        // on: copy-outs now run ahead, 1.5 x the copy-ins (LoRA's 4.8 / 3.0)
        let (mut i, mut o) = (5 * G, 3 * G);
        for _ in 0..20 {
            i += 2 * G;
            o += 3 * G;
            assert!(b.out_first(OutFirst::Auto, i, o));
        }
    }

    #[test]
    fn auto_gives_up_for_good_when_copy_outs_run_over_twice_the_copy_ins() {
        let mut b = Balance::new();
        assert!(b.out_first(OutFirst::Auto, 3 * G, G));
        // 7 GiB more: below TRIAL, whatever the ratio
        assert!(b.out_first(OutFirst::Auto, 4 * G, 7 * G));
        // 9 GiB: copy-outs 8 against 1
        assert!(!b.out_first(OutFirst::Auto, 4 * G, 9 * G));
        // and stays off, even with copy-ins far ahead again
        assert!(!b.out_first(OutFirst::Auto, 400 * G, 9 * G));
    }

    #[test]
    fn auto_never_turns_on_where_copy_outs_lead() {
        // full-parameter AdamW: every step copies out more than it copies in
        let mut b = Balance::new();
        let (mut i, mut o) = (0, 0);
        for _ in 0..50 {
            i += 14 * G;
            o += 18 * G;
            assert!(!b.out_first(OutFirst::Auto, i, o));
        }
    }
}
