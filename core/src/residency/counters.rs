//! What residency did, counted: one declaration per counter yields the
//! snapshot struct (`Counters`, for the stats segment, the summary, `u3m
//! replay` and tests), the live atomics and the snapshot between them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::shm::layout::STALL_BUCKETS;

macro_rules! counters {
    (
        { $( $(#[$doc:meta])* $name:ident, )* }
        $( $(#[$adoc:meta])* $arr:ident [$n:expr], )*
    ) => {
        /// Figures for the stats segment and tests (a snapshot).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Counters {
            $( $(#[$doc])* pub $name: u64, )*
            $( $(#[$adoc])* pub $arr: [u64; $n], )*
        }

        /// The live counters: relaxed atomics, bumped with or without the
        /// residency lock.
        #[derive(Default)]
        pub(super) struct Live {
            $( pub $name: AtomicU64, )*
            $( pub $arr: [AtomicU64; $n], )*
        }

        impl Live {
            pub fn snapshot(&self) -> Counters {
                Counters {
                    $( $name: self.$name.load(Relaxed), )*
                    $( $arr: std::array::from_fn(|i| self.$arr[i].load(Relaxed)), )*
                }
            }
        }
    };
}

counters! {
    {
    /// Chunks made resident for a call (first touches included).
    faults_in,
    /// Of those, first touches: fresh memory mapped, nothing copied (a
    /// program's new allocation, never managed memory of the runtime's).
    first_touches,
    /// Bytes copied into HBM for calls.
    fault_bytes,
    /// Chunks that left HBM.
    evictions,
    /// Bytes copied out of HBM.
    eviction_bytes,
    /// Evictions that needed no copy (a clean host copy existed).
    clean_drops,
    /// Chunks a discard hint (u3m_discard, torch_npu's freed blocks) made
    /// free to leave HBM without a copy-out.
    discards,
    /// Copy-outs to DRAM.
    to_dram,
    /// Copy-outs (and spills) to NVMe.
    to_nvme,
    /// Copy-ins from NVMe.
    from_nvme,
    /// Chunks the background spill moved from DRAM to NVMe (part of to_nvme).
    spilled,
    /// Fault-ins that skipped the copy: the call overwrites the whole chunk.
    overwrites,
    /// NVMe writes or reads that failed (the data stayed in DRAM).
    spill_errors,
    /// Chunks brought back ahead of use by the background prefetch.
    prefetches,
    prefetch_bytes,
    /// Prefetched chunks a call then used while still resident.
    prefetch_hits,
    /// Dirty chunks a call needed again while their asynchronous copy-out
    /// was in flight: they stayed in HBM, the copy was discarded.
    rescued,
    /// Chunks evicted where an outside schedule has them leave, once their
    /// last use before the gap was complete (planned.rs).
    planned_outs,
    /// U3M_PLAN: entries noted (their chunk then leaves as its uses allow,
    /// unless used again first: planned.rs).
    schedule_entries,
    /// U3M_PLAN: 1 once an entry the run did not match stopped it.
    schedule_stops,
    /// U3M_HANDOFF: copy-ins given the HBM of a copy-out still in flight,
    /// ordered after it on the device (migrate.rs `take_outgoing`).
    handoffs,
    /// U3M_HANDOFF: first touches given a copy-out's HBM, zeroed on u3m's
    /// stream (fresh memory reads as the runtime's).
    zeroed,
    /// U3M_HANDOFF: chunks evicted while still in use, u3m's device-to-host
    /// stream ordered after their uses on the device (`evict_ordered`).
    ordered_outs,
    /// Calls that waited for fault-ins and their total wait (ns).
    stall_count,
    stall_ns,
    /// Calls refused before launch: their memory cannot all be made
    /// accessible at once (larger than HBM, host mapping off).
    refused_oversize,
    /// Chunks that became host-mapped (a HOST_NUMA handle at their VAs) for
    /// a call larger than HBM, and the bytes copied into those handles.
    host_maps,
    host_map_bytes,
    /// Host-mapped chunks brought back into HBM (a copy and a remap each).
    host_unmaps,
    /// U3M_HOST_MAP=probe or stream: chunks of read-once streams host-mapped instead
    /// of copied into HBM (part of host_maps), and reads of chunks left
    /// host-mapped instead of copied back (each saved a copy-in and the
    /// eviction it needed).
    stream_maps,
    stream_reads,
    /// Look-ahead prefetch (ahead.rs): chunks it brought in (also counted
    /// in `prefetches`), victims it evicted for them by Belady's rule on
    /// predictions, calls where it stopped for want of a later-used victim,
    /// and its current depth in ticks (a gauge, the latest device's).
    ahead_prefetches,
    ahead_evictions,
    ahead_full,
    ahead_depth,
    /// Prefetched chunks (either prefetch) that left HBM before any call
    /// used them: bytes the link carried for nothing.
    prefetch_wasted,
    /// Calls where the look-ahead only probed (its prefetches were not used
    /// often enough to run at full rate).
    ahead_probes,
    /// U3M_HOST_MAP=probe's read-once probe: verdicts given (each times a
    /// window of mapping against one of copies), and how many chose
    /// mapping (gauges of the probed device).
    probe_verdicts,
    probe_maps,
    }
    /// The waits' histogram (shm::layout::STALL_BOUNDS buckets).
    stall_buckets[STALL_BUCKETS],
}
