//! A seeded pseudorandom generator whose streams never change with crate versions or thread
//! counts: synthesized weights (`runtime::weights`) and the kernel bench's routings
//! (`gemm::moe::route_ids`) are reproducible from their seeds.

/// Deterministic normal generator for synthesized weights: SplitMix64 (Steele, Lea and Flood,
/// "Fast splittable pseudorandom number generators", OOPSLA 2014) feeding Box-Muller. Written
/// here rather than taken from `rand` so that a seed gives the same weights across crate
/// versions and thread counts.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    #[inline]
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// Two independent standard normals (Box-Muller).
    #[inline]
    pub fn normal_pair(&mut self) -> (f32, f32) {
        let r = (-2.0 * self.unit().ln()).sqrt();
        let t = 2.0 * std::f64::consts::PI * self.unit();
        ((r * t.cos()) as f32, (r * t.sin()) as f32)
    }
}
