//! The cost model: the simulator's (docs/simulator.md, preset 910b4) plus
//! NVMe rates (design.md §2). Rates in GB/s are 10^9 B/s, i.e. bytes per ns.

use super::simrt::ns_at;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Costs {
    /// Host↔device link (ACLSIM_LINK_GBPS).
    pub link_gbps: f64,
    /// Device memory bandwidth (ACLSIM_HBM_GBPS).
    pub hbm_gbps: f64,
    /// Operator compute rate (ACLSIM_TFLOPS).
    pub tflops: f64,
    /// Launch latency per operator and memset (ACLSIM_LAUNCH_US); also what
    /// the host spends issuing any call.
    pub launch_us: f64,
    pub nvme_read_gbps: f64,
    pub nvme_write_gbps: f64,
    /// The program's own host↔device copies use pageable memory: half the
    /// link rate, as the simulator charges (the Tier's copies are pinned).
    pub pageable: bool,
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
        }
    }
}

impl Costs {
    pub fn launch_ns(&self) -> u64 {
        (self.launch_us * 1e3).round() as u64
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
}
