//! What this CPU can run, and `multiversioned!`, which compiles a kernel for each tier and
//! picks one at run time, so one binary runs on any x86-64 and uses 16-wide registers where
//! they exist.

/// Which build of the kernels this CPU runs (`multiversioned!` picks it at each call by the
/// same test): "avx512", "avx2" or "portable". For reports such as `bench`'s host line.
pub fn tier() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma") {
            return "avx512";
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return "avx2";
        }
    }
    "portable"
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
    ($(#[$meta:meta])* pub fn $name:ident $(<$t:ident: $bound:ident>)? ($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        pub fn $name $(<$t: $bound>)? ($($arg: $ty),*) {
            #[inline(always)]
            fn portable $(<$t: $bound>)? ($($arg: $ty),*) $body

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx2,fma")]
            unsafe fn avx512 $(<$t: $bound>)? ($($arg: $ty),*) {
                portable $(::<$t>)? ($($arg),*)
            }

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2 $(<$t: $bound>)? ($($arg: $ty),*) {
                portable $(::<$t>)? ($($arg),*)
            }

            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma") {
                // SAFETY: the features `avx512` is compiled with were just detected.
                return unsafe { avx512 $(::<$t>)? ($($arg),*) };
            }
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                // SAFETY: the features `avx2` is compiled with were just detected.
                return unsafe { avx2 $(::<$t>)? ($($arg),*) };
            }
            portable $(::<$t>)? ($($arg),*)
        }
    };
}
pub(crate) use multiversioned;
