//! The cost model: the simulator's (docs/simulator.md, preset 910b4) plus
//! NVMe rates (design.md §2). Rates in GB/s are 10^9 B/s, i.e. bytes per ns.

use super::simrt::{ns_at, HostAccess};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Costs {
    /// Host↔device link (ACLSIM_LINK_GBPS).
    pub link_gbps: f64,
    /// Device memory bandwidth (ACLSIM_HBM_GBPS).
    pub hbm_gbps: f64,
    /// Operator compute rate (ACLSIM_TFLOPS).
    pub tflops: f64,
    /// Launch latency per operator and memset (ACLSIM_LAUNCH_US); also the
    /// least a synchronous call takes the host (`call_us`: asynchronous ones).
    pub launch_us: f64,
    pub nvme_read_gbps: f64,
    pub nvme_write_gbps: f64,
    /// The program's own host↔device copies use pageable memory: half the
    /// link rate, as the simulator charges (the Tier's copies are pinned).
    pub pageable: bool,
    /// One full-duplex link per device shared by every transfer in simulated
    /// time (the simulator's ACLSIM_LINK_MODEL=shared, its default); false:
    /// every stream has the whole link (ACLSIM_LINK_MODEL=per-stream).
    pub shared_link: bool,
    /// An event counts as completed as soon as it is recorded, as the
    /// simulator answers queries: its stream threads run each item as soon
    /// as it is queued, however far ahead of the host's simulated clock it
    /// lies (in phantom mode at once). False: when the device reaches it in
    /// simulated time, as on a real card.
    pub events_at_record: bool,
    /// Stream-ordered hand-over of HBM (a what-if, with `events_at_record`:
    /// the Tier never waits for a victim's queued uses or copy-out): a copy
    /// into or out of a physical handle starts no earlier than the device
    /// work that last used it ends. 0: off; 1: u3m's copy streams stay in
    /// order (a copy waiting for its page holds up the ones behind it);
    /// 2: each copy waits only for its own page (a stream per copy).
    pub handover: u8,
    /// Host time per asynchronous call, µs (default: the launch latency; the
    /// simulator's host clock spends none — it moves only on synchronisation).
    pub call_us: f64,
}

/// One piece of device work, split for the shared link: it lasts
/// max(`base`, the time its link bytes take) + `launch`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Compute and HBM time (copies: their own duration, pageable at half rate).
    pub base: u64,
    pub launch: u64,
    /// Bytes host→device and device→host over the link.
    pub link_in: u64,
    pub link_out: u64,
    /// The duration when every stream has the whole link (per-stream model).
    pub per_stream: u64,
}

impl Default for Costs {
    fn default() -> Costs {
        Costs {
            link_gbps: 25.0,
            hbm_gbps: 800.0,
            tflops: 280.0,
            launch_us: 5.0,
            nvme_read_gbps: 6.5,
            nvme_write_gbps: 4.5,
            pageable: false,
            shared_link: true,
            events_at_record: false,
            handover: 0,
            call_us: 5.0,
        }
    }
}

impl Costs {
    pub fn launch_ns(&self) -> u64 {
        (self.launch_us * 1e3).round() as u64
    }

    /// What the host spends issuing one asynchronous call.
    pub fn call_ns(&self) -> u64 {
        (self.call_us * 1e3).round() as u64
    }

    /// An operator: max(flops / TFLOPS, bytes touched / HBM) + launch.
    pub fn op_ns(&self, flops: u64, bytes: u64) -> u64 {
        let compute = if self.tflops > 0.0 {
            (flops as f64 / (self.tflops * 1e3)).ceil() as u64
        } else {
            0
        };
        compute.max(ns_at(bytes, self.hbm_gbps)) + self.launch_ns()
    }

    /// A memset: bytes / HBM + launch.
    pub fn memset_ns(&self, bytes: u64) -> u64 {
        ns_at(bytes, self.hbm_gbps) + self.launch_ns()
    }

    /// A host↔device copy of the program's (a trace does not say whether
    /// its host memory is pinned: `pageable` decides).
    pub fn link_ns(&self, bytes: u64) -> u64 {
        ns_at(
            bytes,
            if self.pageable {
                self.link_gbps / 2.0
            } else {
                self.link_gbps
            },
        )
    }

    /// A device-to-device copy.
    pub fn d2d_ns(&self, bytes: u64) -> u64 {
        ns_at(bytes, self.hbm_gbps)
    }

    /// Time at the (pinned) link rate: device access to host-mapped memory.
    fn host_link_ns(&self, h: &HostAccess) -> u64 {
        ns_at(h.read + h.write, self.link_gbps)
    }

    /// An operator with some bytes in host-mapped memory (the simulator's
    /// rule): the memory side of the roofline splits into HBM and the link,
    /// which run in parallel — max(flops / TFLOPS, (bytes − footprint) / HBM,
    /// (read + write) / link) + launch. An operator touching k host bytes
    /// costs at least k / link.
    pub fn op_ns_split(&self, flops: u64, bytes: u64, h: &HostAccess) -> u64 {
        if h.read + h.write == 0 {
            return self.op_ns(flops, bytes);
        }
        let compute = if self.tflops > 0.0 {
            (flops as f64 / (self.tflops * 1e3)).ceil() as u64
        } else {
            0
        };
        let local = ns_at(bytes.saturating_sub(h.footprint), self.hbm_gbps);
        compute.max(local).max(self.host_link_ns(h)) + self.launch_ns()
    }

    /// A memset of host-mapped memory: the link instead of HBM for those bytes.
    pub fn memset_ns_split(&self, bytes: u64, h: &HostAccess) -> u64 {
        if h.read + h.write == 0 {
            return self.memset_ns(bytes);
        }
        self.op_ns_split(0, bytes, h)
    }

    /// A device-to-device copy with a side in host-mapped memory.
    pub fn d2d_ns_split(&self, bytes: u64, h: &HostAccess) -> u64 {
        self.d2d_ns(bytes).max(self.host_link_ns(h))
    }

    /// A host↔device copy whose device side is host-mapped memory: it crosses
    /// the link twice.
    pub fn copy_ns_split(&self, bytes: u64, h: &HostAccess) -> u64 {
        self.link_ns(bytes) + self.host_link_ns(h)
    }

    fn compute_ns(&self, flops: u64) -> u64 {
        if self.tflops > 0.0 {
            (flops as f64 / (self.tflops * 1e3)).ceil() as u64
        } else {
            0
        }
    }

    /// An operator (a memset: no flops) as `Work`: reads of host-mapped
    /// memory go host→device, writes device→host.
    pub fn op_work(&self, flops: u64, bytes: u64, h: &HostAccess) -> Work {
        Work {
            base: self
                .compute_ns(flops)
                .max(ns_at(bytes.saturating_sub(h.footprint), self.hbm_gbps)),
            launch: self.launch_ns(),
            link_in: h.read,
            link_out: h.write,
            per_stream: self.op_ns_split(flops, bytes, h),
        }
    }

    pub fn memset_work(&self, bytes: u64, h: &HostAccess) -> Work {
        Work {
            per_stream: self.memset_ns_split(bytes, h),
            ..self.op_work(0, bytes, h)
        }
    }

    pub fn d2d_work(&self, bytes: u64, h: &HostAccess) -> Work {
        Work {
            base: self.d2d_ns(bytes),
            launch: 0,
            link_in: h.read,
            link_out: h.write,
            per_stream: self.d2d_ns_split(bytes, h),
        }
    }

    /// A host↔device copy of the program's (`to_device`: H2D).
    pub fn copy_work(&self, bytes: u64, to_device: bool, h: &HostAccess) -> Work {
        let (a, b) = if to_device { (bytes, 0) } else { (0, bytes) };
        Work {
            base: self.link_ns(bytes),
            launch: 0,
            link_in: a + h.read,
            link_out: b + h.write,
            per_stream: self.copy_ns_split(bytes, h),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulator_formulas() {
        let c = Costs::default();
        // 280 TFLOPS: 2.8e14 flops take 1 s
        assert_eq!(c.op_ns(280_000_000_000_000, 0), 1_000_000_000 + 5_000);
        // memory-bound: 800 GB/s moves 8e8 bytes in 1 ms
        assert_eq!(c.op_ns(0, 800_000_000), 1_000_000 + 5_000);
        assert_eq!(c.link_ns(25_000_000), 1_000_000);
        assert_eq!(c.memset_ns(0), 5_000);
    }

    #[test]
    fn host_mapped_bytes_go_over_the_link() {
        let c = Costs::default();
        const MIB: u64 = 1 << 20;
        let none = HostAccess::default();
        assert_eq!(c.op_ns_split(0, 48 * MIB, &none), c.op_ns(0, 48 * MIB));
        // Add over three 16 MiB operands all in host memory (the simulator's
        // hostmem_app --case cost prints 2018266 ns)
        let all = HostAccess {
            read: 32 * MIB,
            write: 16 * MIB,
            footprint: 48 * MIB,
        };
        assert_eq!(c.op_ns_split(0, 48 * MIB, &all), 2_013_266 + 5_000);
        // k host bytes cost at least k / link, whatever else the call does
        let half = HostAccess {
            read: 16 * MIB,
            write: 0,
            footprint: 16 * MIB,
        };
        assert!(c.op_ns_split(1_000, 48 * MIB, &half) >= ns_at(16 * MIB, 25.0));
        // ApplyAdam over 1 MiB var/m/v in host memory: 3 MiB each way
        let adam = HostAccess {
            read: 3 * MIB,
            write: 3 * MIB,
            footprint: 6 * MIB,
        };
        assert_eq!(c.op_ns_split(0, 7 * MIB, &adam), 251_659 + 5_000);
        let copy = HostAccess {
            read: 16 * MIB,
            write: 0,
            footprint: 16 * MIB,
        };
        assert_eq!(c.d2d_ns_split(16 * MIB, &copy), 671_089);
        assert_eq!(c.copy_ns_split(16 * MIB, &copy), 2 * 671_089);
        let set = HostAccess {
            read: 0,
            write: 16 * MIB,
            footprint: 16 * MIB,
        };
        assert_eq!(c.memset_ns_split(16 * MIB, &set), 671_089 + 5_000);
    }
}
