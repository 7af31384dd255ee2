//! Multi-GPU rigs: the kernel suite on several GPUs at once and the spread between same-model
//! cards ([`spread`]), the interconnect (peer-to-peer copies, all-reduce through NCCL at the
//! message sizes of a tensor-parallel decode step), the all-reduce cost per decode step, the
//! tensor-parallel prediction ([`tp`]), PyTorch's figures for the same transfers ([`peers`]), and
//! the report section ([`render`]).
//!
//! The measurements of the interconnect are here ([`p2p`], [`allreduce`]); the device work they
//! call (contexts, buffers, peer copies, NCCL) is in [`crate::gpu::multi`] and
//! [`crate::gpu::nccl`]. The rest is host logic, tested on the CPU. With one GPU, or none, every
//! part is skipped with the reason.

pub mod allreduce;
pub mod p2p;
pub mod peers;
pub mod render;
pub mod schema;
pub mod spread;
pub mod tp;
pub mod tp_model;

pub use schema::MultiGpuResults;

use crate::RigError;

/// Which GPUs `--devices` selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSelection {
    /// Every GPU the driver reports.
    All,
    /// These CUDA indices, in this order.
    List(Vec<usize>),
}

impl Default for DeviceSelection {
    fn default() -> Self {
        DeviceSelection::List(vec![0])
    }
}

impl std::str::FromStr for DeviceSelection {
    type Err = String;
    /// `all`, or comma-separated CUDA indices (`0,1`), each at most once.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("all") {
            return Ok(DeviceSelection::All);
        }
        let mut v = Vec::new();
        for part in t.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let i: usize = part.parse().map_err(|_| {
                format!("'{part}' is not a device index; use `all` or indices such as 0,1")
            })?;
            if v.contains(&i) {
                return Err(format!("device {i} is listed twice"));
            }
            v.push(i);
        }
        if v.is_empty() {
            return Err("empty list; use `all` or indices such as 0,1".into());
        }
        Ok(DeviceSelection::List(v))
    }
}

impl std::fmt::Display for DeviceSelection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSelection::All => write!(f, "all"),
            DeviceSelection::List(v) => write!(
                f,
                "{}",
                v.iter()
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }
}

impl DeviceSelection {
    /// The CUDA indices selected on a machine with `available` GPUs.
    ///
    /// # Errors
    /// [`RigError::BadFlag`] (`--devices`) for an index the machine does not have. With no GPU
    /// at all the result is empty (the GPU parts are then skipped with the reason).
    pub fn resolve(&self, available: usize) -> Result<Vec<usize>, RigError> {
        match self {
            DeviceSelection::All => Ok((0..available).collect()),
            DeviceSelection::List(_) if available == 0 => Ok(Vec::new()),
            DeviceSelection::List(v) => {
                if let Some(bad) = v.iter().find(|i| **i >= available) {
                    return Err(RigError::flag(
                        "--devices",
                        format!(
                            "this machine has {available} GPU{} (indices 0 to {}); there is no device {bad}",
                            if available == 1 { "" } else { "s" },
                            available - 1
                        ),
                    ));
                }
                Ok(v.clone())
            }
        }
    }
}

/// Decode batches whose all-reduce message is measured: M = 1, 2, 4, … 256.
pub const DECODE_M: [usize; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

/// Large all-reduce messages, bytes: where the bus bandwidth reaches its plateau.
pub const LARGE_BYTES: [u64; 3] = [32 << 20, 128 << 20, 512 << 20];

/// The all-reduce message of a tensor-parallel decode step at batch `m`: the BF16 activations
/// after a row-parallel linear layer, hidden size × M × 2 bytes.
pub fn decode_message_bytes(hidden_size: usize, m: usize) -> u64 {
    hidden_size as u64 * m as u64 * 2
}

/// The message sizes to measure: the decode sizes for [`DECODE_M`] (when the hidden size is
/// known) and [`LARGE_BYTES`], ascending, each once, with the M each decode size stands for.
pub fn message_sizes(hidden_size: Option<usize>) -> Vec<(u64, Option<usize>)> {
    let mut v: Vec<(u64, Option<usize>)> = Vec::new();
    if let Some(h) = hidden_size.filter(|h| *h > 0) {
        v.extend(
            DECODE_M
                .iter()
                .map(|&m| (decode_message_bytes(h, m), Some(m))),
        );
    }
    for b in LARGE_BYTES {
        if !v.iter().any(|(x, _)| *x == b) {
            v.push((b, None));
        }
    }
    v.sort_by_key(|(b, _)| *b);
    v
}

/// Communicator sizes to measure over `n` selected GPUs: 2, 4, 8, … below `n`, and `n`.
pub fn world_sizes(n: usize) -> Vec<usize> {
    if n < 2 {
        return Vec::new();
    }
    let mut v = Vec::new();
    let mut w = 2;
    while w < n {
        v.push(w);
        w *= 2;
    }
    v.push(n);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_selection_parses_and_resolves() {
        assert_eq!("all".parse::<DeviceSelection>(), Ok(DeviceSelection::All));
        assert_eq!(
            " 1, 0 ".parse::<DeviceSelection>(),
            Ok(DeviceSelection::List(vec![1, 0]))
        );
        assert!("0,0"
            .parse::<DeviceSelection>()
            .unwrap_err()
            .contains("twice"));
        assert!("x".parse::<DeviceSelection>().unwrap_err().contains("'x'"));
        assert!("".parse::<DeviceSelection>().is_err());
        assert_eq!(DeviceSelection::All.resolve(2).unwrap(), vec![0, 1]);
        assert_eq!(
            DeviceSelection::All.resolve(0).unwrap(),
            Vec::<usize>::new()
        );
        assert_eq!(
            DeviceSelection::List(vec![3]).resolve(0).unwrap(),
            Vec::<usize>::new(),
            "no GPU: nothing to select, the parts are skipped with the reason"
        );
        let e = DeviceSelection::List(vec![0, 2]).resolve(2).unwrap_err();
        assert!(e.to_string().contains("--devices") && e.to_string().contains("device 2"));
        assert_eq!(DeviceSelection::List(vec![1, 0]).to_string(), "1,0");
        assert_eq!(DeviceSelection::default().to_string(), "0");
    }

    #[test]
    fn message_sizes_are_the_decode_step_and_large() {
        // Qwen3.6-27B: hidden 5120; M = 1 → 10,240 bytes; M = 256 → 2.5 MiB.
        assert_eq!(decode_message_bytes(5120, 1), 10_240);
        assert_eq!(decode_message_bytes(5120, 256), 2_621_440);
        let s = message_sizes(Some(5120));
        assert_eq!(s.len(), 12);
        assert_eq!(s[0], (10_240, Some(1)));
        assert_eq!(s[8], (2_621_440, Some(256)));
        assert_eq!(s[11], (512 << 20, None));
        assert!(s.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(message_sizes(None).len(), 3);
    }

    #[test]
    fn world_sizes_cover_two_and_all() {
        assert!(world_sizes(1).is_empty());
        assert_eq!(world_sizes(2), vec![2]);
        assert_eq!(world_sizes(3), vec![2, 3]);
        assert_eq!(world_sizes(8), vec![2, 4, 8]);
    }
}
