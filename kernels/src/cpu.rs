//! What this CPU can run, and `multiversioned!`, which compiles a kernel for each tier and
//! picks one at run time, so one binary runs on any x86-64 and uses 16-wide registers where
//! they exist.
//!
//! The tier can be lowered with the environment variable `RUNTIME_CPU` (`portable`, `avx2`,
//! `avx512`, `avx512vnni`, `amx`), read once: so every tier's kernels are tested and measured on a
//! host that has a higher one. A tier above what the CPU has changes nothing. `testing`
//! decides whether a test of a tier's kernels runs, and when skipping it is a failure.

use std::sync::OnceLock;

#[doc(hidden)]
pub mod testing;

/// The builds of the kernels, lowest first; each tier's CPUs run every tier below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// Plain Rust, as the compiler's baseline target builds it.
    Portable,
    /// AVX2, FMA and F16C (Haswell, Zen 1 and later): 8-wide f32, the int8 products with
    /// `vpmaddubsw` + `vpmaddwd`.
    Avx2,
    /// AVX-512 F, BW, DQ and VL (Skylake-SP and later, Zen 4): 16-wide f32; the int8
    /// products as on AVX2.
    Avx512,
    /// AVX-512 with VNNI (Ice Lake, Sapphire Rapids, Zen 4): the int8 products with
    /// `vpdpbusd`, four byte products a lane an instruction.
    Avx512Vnni,
    /// AVX-512 VNNI and BF16 with AMX's tiles (Sapphire Rapids and later Xeons), which
    /// the kernel lets this process use: prompts' bf16 products as tile products, one
    /// `tdpbf16ps` doing 16 × 16 × 32 multiply-adds.
    Amx,
}

impl Tier {
    /// Every tier, lowest first.
    pub const ALL: [Tier; 5] = [
        Tier::Portable,
        Tier::Avx2,
        Tier::Avx512,
        Tier::Avx512Vnni,
        Tier::Amx,
    ];

    /// The name `RUNTIME_CPU` and reports use.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Portable => "portable",
            Tier::Avx2 => "avx2",
            Tier::Avx512 => "avx512",
            Tier::Avx512Vnni => "avx512vnni",
            Tier::Amx => "amx",
        }
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Tier {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Tier::ALL
            .into_iter()
            .find(|tier| tier.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Tier::ALL.iter().map(|tier| tier.name()).collect();
                format!(
                    "unknown CPU tier `{s}` (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

/// The tier the kernels run: the highest this CPU has, lowered to `RUNTIME_CPU` if that is
/// set (an unknown name is ignored here; [`requested`] reports it).
pub fn tier() -> Tier {
    static TIER: OnceLock<Tier> = OnceLock::new();
    *TIER.get_or_init(|| match requested() {
        Ok(Some(cap)) => detected().min(cap),
        _ => detected(),
    })
}

/// The tier `RUNTIME_CPU` asks for, if it is set; an error naming it if it is not a tier.
/// Programs call this once at start to turn a mistyped name into an error.
pub fn requested() -> Result<Option<Tier>, String> {
    named_by("RUNTIME_CPU")
}

/// The tier the environment variable `var` names, if it is set; an error naming it if it is
/// not a tier.
fn named_by(var: &str) -> Result<Option<Tier>, String> {
    match std::env::var(var) {
        Ok(name) => (name.parse()).map(Some).map_err(|e| format!("{var}: {e}")),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{var} is not UTF-8")),
    }
}

/// The highest tier this CPU has.
pub fn detected() -> Tier {
    #[cfg(target_arch = "x86_64")]
    {
        use std::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            if has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl") {
                if has!("avx512vnni") {
                    if has!("avx512bf16") && amx_granted() {
                        return Tier::Amx;
                    }
                    return Tier::Avx512Vnni;
                }
                return Tier::Avx512;
            }
            return Tier::Avx2;
        }
    }
    Tier::Portable
}

/// Whether this CPU has AMX's tiles with their bf16 and int8 products, and Linux lets this
/// process use them: the tiles' 8 KiB of state is saved on a context switch only for a
/// process that asked (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), once, for all its threads.
/// (`is_x86_feature_detected!` does not know AMX on stable Rust: CPUID leaf 7 tells.)
#[cfg(target_arch = "x86_64")]
fn amx_granted() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // Leaf 7 exists on every CPU with AVX-512 (checked by the caller).
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    let (bf16, tile, int8) = (edx >> 22 & 1, edx >> 24 & 1, edx >> 25 & 1);
    // SAFETY: a request about this process's own state; it touches no memory of ours.
    bf16 == 1
        && tile == 1
        && int8 == 1
        && unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            )
        } == 0
}

/// The vector features of this CPU that matter to the kernels, present or not, as
/// `name` / `-name`: which host a figure came from (the bf16 and int8 dot products are
/// what llama.cpp's fastest paths use).
pub fn cpu_features() -> Vec<String> {
    let mut features = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        let present = [
            ("avx2", std::is_x86_feature_detected!("avx2")),
            ("fma", std::is_x86_feature_detected!("fma")),
            ("avx512f", std::is_x86_feature_detected!("avx512f")),
            ("avx512bf16", std::is_x86_feature_detected!("avx512bf16")),
            ("avx512vnni", std::is_x86_feature_detected!("avx512vnni")),
            ("avx512fp16", std::is_x86_feature_detected!("avx512fp16")),
            ("amx", detected() == Tier::Amx),
        ];
        for (name, present) in present {
            features.push(if present {
                name.to_string()
            } else {
                format!("-{name}")
            });
        }
    }
    features
}

/// Defines `pub fn $name` running `$body` compiled with AVX-512 (and FMA) when the CPU has
/// it, else with AVX2 and FMA when it has those (a `mul_add` is then one instruction, not a
/// call to libm's `fmaf`). The body and the `#[inline(always)]` helpers it calls are inlined into a function
/// with those target features; a closure would not be (LLVM declines to inline a large
/// one), which silently leaves the loops at 4-wide SSE.
macro_rules! multiversioned {
    ($(#[$meta:meta])* $vis:vis fn $name:ident $(<$t:ident: $bound:ident>)? ($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name $(<$t: $bound>)? ($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn portable $(<$t: $bound>)? ($($arg: $ty),*) $(-> $ret)? $body

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx2,fma")]
            unsafe fn avx512 $(<$t: $bound>)? ($($arg: $ty),*) $(-> $ret)? {
                portable $(::<$t>)? ($($arg),*)
            }

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2 $(<$t: $bound>)? ($($arg: $ty),*) $(-> $ret)? {
                portable $(::<$t>)? ($($arg),*)
            }

            #[cfg(target_arch = "x86_64")]
            match $crate::cpu::tier() {
                // SAFETY: the tier's CPUs have the features `avx512` is compiled with.
                $crate::cpu::Tier::Avx512
                | $crate::cpu::Tier::Avx512Vnni
                | $crate::cpu::Tier::Amx => {
                    return unsafe { avx512 $(::<$t>)? ($($arg),*) };
                }
                // SAFETY: as above, for `avx2`.
                $crate::cpu::Tier::Avx2 => return unsafe { avx2 $(::<$t>)? ($($arg),*) },
                $crate::cpu::Tier::Portable => {}
            }
            portable $(::<$t>)? ($($arg),*)
        }
    };
}
pub(crate) use multiversioned;
