//! For tests only: whether a test of kernels that need more than the portable tier runs
//! here, and what a test that cannot run may do.
//!
//! A kernel test that needs a tier (or AVX512_BF16) asks [`runs`] first, which answers from
//! the tier the kernels run at ([`super::tier`]). When that tier lacks what the test needs,
//! the test is skipped, and the skip is said on stderr. Two reasons, treated apart:
//! - `RUNTIME_CPU` lowered the tier on purpose below what the CPU has (`just test-tiers`
//!   runs the tests at every tier below the CPU's): always a skip.
//! - The CPU itself lacks it: a skip, unless the environment variable `REQUIRE_KERNELS`
//!   names a tier at or above the one the test needs, where it is a failure naming what is
//!   missing and the CPU, so a host without the kernels cannot pass by running none of
//!   their tests. CI sets `REQUIRE_KERNELS=avx2`: every kind of host it has met has AVX2
//!   (Intel Sapphire Rapids and Ice Lake and AMD Zen 4 have AVX-512 VNNI too, AMD Zen 3 has
//!   no AVX-512), so the AVX2 kernels' tests run on all of them and the AVX-512 ones
//!   wherever the CPU has it. AMX and AVX512_BF16 are never required: no CI host is sure to
//!   have them (Zen 4 lacks AMX, Ice Lake and Zen 3 lack both).

use super::{Tier, detected, tier};

/// What a kernel test needs of the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// The kernels of this tier (its CPUs run every tier below it).
    Tier(Tier),
    /// `vdpbf16ps` (AVX512_BF16) and the AVX-512 tier: [`crate::dpbf16`]'s kernels.
    Bf16,
}

impl Needs {
    /// The tier the kernels must run at.
    fn tier(self) -> Tier {
        match self {
            Needs::Tier(tier) => tier,
            Needs::Bf16 => Tier::Avx512,
        }
    }

    /// What the CPU lacks of it, by feature name (empty if nothing).
    fn missing(self) -> Vec<&'static str> {
        #[cfg(target_arch = "x86_64")]
        {
            use std::is_x86_feature_detected as has;
            let mut wanted: Vec<(&'static str, bool)> = Vec::new();
            let tier = self.tier();
            if tier >= Tier::Avx2 {
                wanted.extend([
                    ("avx2", has!("avx2")),
                    ("fma", has!("fma")),
                    ("f16c", has!("f16c")),
                ]);
            }
            if tier >= Tier::Avx512 {
                wanted.extend([
                    ("avx512f", has!("avx512f")),
                    ("avx512bw", has!("avx512bw")),
                    ("avx512dq", has!("avx512dq")),
                    ("avx512vl", has!("avx512vl")),
                ]);
            }
            if tier >= Tier::Avx512Vnni {
                wanted.push(("avx512vnni", has!("avx512vnni")));
            }
            if tier >= Tier::Amx || self == Needs::Bf16 {
                wanted.push(("avx512bf16", has!("avx512bf16")));
            }
            let mut missing: Vec<&'static str> = (wanted.into_iter())
                .filter(|&(_, present)| !present)
                .map(|(name, _)| name)
                .collect();
            // The tiles, or Linux's leave to use them (`cpu::amx_granted`).
            if tier >= Tier::Amx && missing.is_empty() && detected() < Tier::Amx {
                missing.push("amx (amx-tile, amx-bf16, amx-int8, granted by Linux)");
            }
            missing
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            match self.tier() {
                Tier::Portable => Vec::new(),
                _ => vec!["x86-64"],
            }
        }
    }
}

impl std::fmt::Display for Needs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Needs::Tier(tier) => write!(f, "the {tier} tier"),
            Needs::Bf16 => write!(f, "AVX512_BF16 at the avx512 tier"),
        }
    }
}

/// Whether a test of kernels that need `needs` runs here: true when the kernels' tier has
/// it. Otherwise says why the test is skipped and returns false, or panics where the
/// module's introduction says (the CPU lacking a tier at or below `REQUIRE_KERNELS`'s, AMX
/// and AVX512_BF16 aside); panics too on a `RUNTIME_CPU` or `REQUIRE_KERNELS` that names no
/// tier, which would test the CPU's own tier under another's name or require nothing.
pub fn runs(needs: Needs) -> bool {
    if let Err(e) = super::requested() {
        panic!("{e}");
    }
    let required = required().unwrap_or_else(|e| panic!("{e}"));
    let missing = needs.missing();
    if missing.is_empty() {
        if tier() >= needs.tier() {
            return true;
        }
        eprintln!(
            "skipped: RUNTIME_CPU={} is below {needs}, which this test needs",
            tier()
        );
        return false;
    }
    let what = format!(
        "this CPU ({}) lacks {}, which {needs} needs",
        cpu_name(),
        missing.join(", ")
    );
    if needs.tier() >= Tier::Amx || needs == Needs::Bf16 {
        eprintln!("skipped: {what} (optional: AMX and AVX512_BF16 are on only some of CI's hosts)");
        return false;
    }
    if let Some(required) = required {
        assert!(
            needs.tier() > required,
            "REQUIRE_KERNELS={required}, but {what}: the test would pass without running"
        );
    }
    eprintln!("skipped: {what}");
    false
}

/// The tier `REQUIRE_KERNELS` names, if it is set; an error naming a value that is not a
/// tier.
pub fn required() -> Result<Option<Tier>, String> {
    super::named_by("REQUIRE_KERNELS")
}

/// The CPU's name as it gives it (CPUID's brand string), for messages.
pub fn cpu_name() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        // Leaf 0x8000_0000 says which extended leaves follow.
        let top = __cpuid(0x8000_0000).eax;
        if top >= 0x8000_0004 {
            let mut bytes = Vec::with_capacity(48);
            for leaf in 0x8000_0002..=0x8000_0004 {
                let r = __cpuid(leaf);
                for word in [r.eax, r.ebx, r.ecx, r.edx] {
                    bytes.extend(word.to_le_bytes());
                }
            }
            let name = String::from_utf8_lossy(&bytes);
            let name = name.trim_matches(|c: char| c == '\0' || c.is_whitespace());
            if !name.is_empty() {
                return name.to_string();
            }
        }
        "an x86-64 CPU without a brand string".to_string()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        format!("a {} CPU", std::env::consts::ARCH)
    }
}
