//! The compute capability of a CUDA device (`major.minor`, written `sm_XY`): a plain device fact,
//! read by [`super::probe`] and used to pick the NVRTC architecture.

use serde::{Deserialize, Serialize};

/// A CUDA compute capability (`major.minor`, written `sm_XY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ComputeCapability {
    /// Major version (e.g. 9 for Hopper).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl ComputeCapability {
    /// Build from major and minor.
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// `major·10 + minor` (90 for sm_90).
    pub fn as_int(self) -> u32 {
        self.major * 10 + self.minor
    }

    /// The NVRTC `--gpu-architecture` value, e.g. `sm_90`.
    pub fn arch_flag(self) -> String {
        format!("sm_{}", self.as_int())
    }
}

impl std::fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sm_{}{}", self.major, self.minor)
    }
}

impl std::str::FromStr for ComputeCapability {
    type Err = String;
    /// Accepts `sm_90`, `sm90`, `9.0` or `90`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        let t = t.trim_start_matches("sm_").trim_start_matches("sm");
        let bad = || format!("invalid compute capability '{s}'; expected e.g. sm_90 or 9.0");
        if let Some((a, b)) = t.split_once('.') {
            return Ok(Self::new(
                a.parse().map_err(|_| bad())?,
                b.parse().map_err(|_| bad())?,
            ));
        }
        let v: u32 = t.parse().map_err(|_| bad())?;
        if !(10..=999).contains(&v) {
            return Err(bad());
        }
        Ok(Self::new(v / 10, v % 10))
    }
}
