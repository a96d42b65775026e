//! Matrix-vector products over quantized rows on AVX-512, each block decoded in registers
//! as it streams in: no decoded copy of the rows is written and read back.
//!
//! Exact: a block's values are computed as [`crate::quant`] decodes them (the same f32
//! operations), and each row's products are summed as `bundles::matvec_bundles` sums an f32
//! row (one FMA chain per lane, lane `i` taking the values `i`, `i + 16`, ... in order; the
//! lanes added in order), so the results are those of the f32 path on the decoded values,
//! bit for bit, whatever the batch.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    use crate::quant::BlockType;
    use crate::simd::avx512::sums16;

    /// A row of blocks, read 32 values at a time.
    pub(super) trait Row: Copy {
        const TYPE: BlockType;

        /// Its first byte.
        fn start(self) -> *const u8;

        /// Values `c..c + 32` (`c` a multiple of 32) in two registers.
        ///
        /// # Safety
        /// AVX-512F present; the row holds value `c + 31`.
        unsafe fn chunk32(self, c: usize) -> [__m512; 2];

        /// Hints into L1 the bytes `ahead` bytes after those of values `c..c + 64`: the same
        /// place in the row a bundle further on (the rows of a share are one after another).
        #[inline(always)]
        fn fetch(self, c: usize, ahead: usize) {
            let at = c * Self::TYPE.bytes() / Self::TYPE.values() + ahead;
            // SAFETY: a prefetch is a hint; it reads nothing and never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(self.start().wrapping_add(at).cast()) };
        }
    }

    /// The f16 at `p` widened, in every lane.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn half(p: *const u8) -> __m512 {
        // SAFETY: the caller's block holds two bytes at p.
        _mm512_cvtph_ps(_mm256_set1_epi16(unsafe {
            p.cast::<i16>().read_unaligned()
        }))
    }

    /// Sixteen bytes at `p` zero-extended to i32 lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn bytes16(p: *const u8) -> __m512i {
        _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(p.cast()) })
    }

    #[derive(Clone, Copy)]
    pub(super) struct Q8_0(pub *const u8);

    impl Row for Q8_0 {
        const TYPE: BlockType = BlockType::Q8_0;

        fn start(self) -> *const u8 {
            self.0
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn chunk32(self, c: usize) -> [__m512; 2] {
            unsafe {
                let block = self.0.add(c / 32 * 34);
                let d = half(block);
                let q = |at: usize| {
                    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(block.add(at).cast())))
                };
                [_mm512_mul_ps(q(2), d), _mm512_mul_ps(q(18), d)]
            }
        }
    }

    #[derive(Clone, Copy)]
    pub(super) struct Q4_0(pub *const u8);

    impl Row for Q4_0 {
        const TYPE: BlockType = BlockType::Q4_0;

        fn start(self) -> *const u8 {
            self.0
        }

        /// Through a table of the block's sixteen values, `d * (q - 8)` for each code (each
        /// exact: an f16 times a small integer), looked up by `vpermps`, which reads only a
        /// lane's low four bits: one instruction a register where the arithmetic is three.
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn chunk32(self, c: usize) -> [__m512; 2] {
            unsafe {
                let block = self.0.add(c / 32 * 18);
                let table = _mm512_mul_ps(half(block), codes(-8.0));
                let q = bytes16(block.add(2));
                [
                    _mm512_permutexvar_ps(q, table),
                    _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(q), table),
                ]
            }
        }
    }

    /// `first`, `first + 1`, ..., `first + 15`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn codes(first: f32) -> __m512 {
        _mm512_add_ps(
            _mm512_set1_ps(first),
            _mm512_setr_ps(
                0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0,
                15.0,
            ),
        )
    }

    #[derive(Clone, Copy)]
    pub(super) struct Q5_0(pub *const u8);

    impl Row for Q5_0 {
        const TYPE: BlockType = BlockType::Q5_0;

        fn start(self) -> *const u8 {
            self.0
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn chunk32(self, c: usize) -> [__m512; 2] {
            unsafe {
                let block = self.0.add(c / 32 * 22);
                let d = half(block);
                let qh = _mm512_set1_epi32(block.add(2).cast::<i32>().read_unaligned());
                let q = bytes16(block.add(6));
                let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
                let fifth = |shift: __m512i| {
                    let bit = _mm512_and_si512(_mm512_srlv_epi32(qh, shift), _mm512_set1_epi32(1));
                    _mm512_slli_epi32::<4>(bit)
                };
                let sixteen = _mm512_set1_epi32(16);
                let low =
                    _mm512_or_si512(_mm512_and_si512(q, _mm512_set1_epi32(0x0f)), fifth(lanes));
                let high = _mm512_or_si512(
                    _mm512_srli_epi32::<4>(q),
                    fifth(_mm512_add_epi32(lanes, sixteen)),
                );
                [
                    _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(low, sixteen))),
                    _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(high, sixteen))),
                ]
            }
        }
    }

    #[derive(Clone, Copy)]
    pub(super) struct Q4K(pub *const u8);

    impl Row for Q4K {
        const TYPE: BlockType = BlockType::Q4K;

        fn start(self) -> *const u8 {
            self.0
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn chunk32(self, c: usize) -> [__m512; 2] {
            unsafe {
                let block = self.0.add(c / 256 * 144);
                let g = c % 256 / 32;
                // The group's six-bit scale and min (`quant::scale_min_k4`).
                let packed = std::slice::from_raw_parts(block.add(4), 12);
                let (scale, min) = if g < 4 {
                    (packed[g] & 0x3f, packed[g + 4] & 0x3f)
                } else {
                    (
                        (packed[g + 4] & 0x0f) | ((packed[g - 4] >> 2) & 0x30),
                        (packed[g + 4] >> 4) | ((packed[g] >> 2) & 0x30),
                    )
                };
                // d and dmin, the block's first four bytes, widened together.
                let both = _mm_cvtph_ps(_mm_cvtsi32_si128(block.cast::<i32>().read_unaligned()));
                let (d, dmin) = (_mm_cvtss_f32(both), _mm_cvtss_f32(_mm_movehdup_ps(both)));
                let (dl, ml) = (
                    _mm512_set1_ps(d * scale as f32),
                    _mm512_set1_ps(dmin * min as f32),
                );
                // The group's sixteen values, `(d * scale) * q - dmin * min` each, looked up
                // as Q4_0's are (`vpermps` reads a lane's low four bits).
                let table = _mm512_sub_ps(_mm512_mul_ps(dl, codes(0.0)), ml);
                let qs = block.add(16 + g / 2 * 32);
                // An even group's nibbles are the low ones, which vpermps reads as they are.
                let q = |at: usize| match g % 2 {
                    0 => bytes16(qs.add(at)),
                    _ => _mm512_srli_epi32::<4>(bytes16(qs.add(at))),
                };
                [
                    _mm512_permutexvar_ps(q(0), table),
                    _mm512_permutexvar_ps(q(16), table),
                ]
            }
        }
    }

    #[derive(Clone, Copy)]
    pub(super) struct Q6K(pub *const u8);

    impl Row for Q6K {
        const TYPE: BlockType = BlockType::Q6K;

        fn start(self) -> *const u8 {
            self.0
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn chunk32(self, c: usize) -> [__m512; 2] {
            unsafe {
                let block = self.0.add(c / 256 * 210);
                let cc = c % 256 / 32;
                let (half_, quarter) = (cc / 4, cc % 4);
                // The 32 six-bit codes in bytes, 32 at a time (16-bit shifts, then masks that
                // drop what the neighbouring byte shifted in), minus 32: one signed byte each.
                let low = _mm256_loadu_si256(block.add(half_ * 64 + (quarter % 2) * 32).cast());
                let high = _mm256_loadu_si256(block.add(128 + half_ * 32).cast());
                let low = _mm256_and_si256(
                    _mm256_srl_epi16(low, _mm_cvtsi32_si128(4 * (quarter / 2) as i32)),
                    _mm256_set1_epi8(0x0f),
                );
                let high = _mm256_and_si256(
                    _mm256_srl_epi16(high, _mm_cvtsi32_si128(2 * quarter as i32)),
                    _mm256_set1_epi8(3),
                );
                let q = _mm256_sub_epi8(
                    _mm256_or_si256(low, _mm256_slli_epi16::<4>(high)),
                    _mm256_set1_epi8(32),
                );
                let d = _mm512_cvtss_f32(half(block.add(208)));
                let scales = block.add(192 + 2 * cc).cast::<i8>();
                let value = |q: __m128i, scale: i8| {
                    let q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
                    _mm512_mul_ps(_mm512_set1_ps(d * f32::from(scale)), q)
                };
                [
                    value(_mm256_castsi256_si128(q), *scales),
                    value(_mm256_extracti128_si256::<1>(q), *scales.add(1)),
                ]
            }
        }
    }

    /// The products of four rows of `ty` blocks with each of the `n` vectors of `d_in` in
    /// `xs`, handed to `store(vector, row, value)`.
    ///
    /// # Safety
    /// AVX-512F present; `ty` kept ([`BlockType::kept`]); each row holds `d_in` values (a
    /// multiple of 32) of `ty` blocks;
    /// `xs` holds `n * d_in` values.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn four(
        ty: BlockType,
        rows: [*const u8; 4],
        xs: &[f32],
        d_in: usize,
        store: &mut impl FnMut(usize, usize, f32),
    ) {
        unsafe {
            match ty {
                BlockType::Q8_0 => four_of(rows.map(Q8_0), xs, d_in, store),
                BlockType::Q4_0 => four_of(rows.map(Q4_0), xs, d_in, store),
                BlockType::Q5_0 => four_of(rows.map(Q5_0), xs, d_in, store),
                BlockType::Q4K => four_of(rows.map(Q4K), xs, d_in, store),
                BlockType::Q6K => four_of(rows.map(Q6K), xs, d_in, store),
                other => unreachable!("{other} is not kept as blocks"),
            }
        }
    }

    /// [`four`] for one block type: eight vectors at a time (two rows, sixteen sums), then
    /// four, then one, as `bundles::matvec_bundles` takes f32 rows.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn four_of<R: Row>(
        rows: [R; 4],
        xs: &[f32],
        d_in: usize,
        store: &mut impl FnMut(usize, usize, f32),
    ) {
        let n = xs.len() / d_in;
        let ahead = R::TYPE.row_bytes(d_in).expect("rows of whole blocks");
        let x = |b: usize| xs[b * d_in..][..d_in].as_ptr();
        let mut b = 0;
        unsafe {
            while n - b >= 8 {
                let vectors = std::array::from_fn(|v| x(b + v));
                for pair in [0, 2] {
                    let sums = dot2_x8([rows[pair], rows[pair + 1]], vectors, d_in, ahead);
                    for (v, sums) in sums.iter().enumerate() {
                        store(b + v, pair, sums[0]);
                        store(b + v, pair + 1, sums[1]);
                    }
                }
                b += 8;
            }
            while n - b >= 4 {
                let sums = dot4_x4(rows, std::array::from_fn(|v| x(b + v)), d_in, ahead);
                for (v, sums) in sums.iter().enumerate() {
                    for (k, &value) in sums.iter().enumerate() {
                        store(b + v, k, value);
                    }
                }
                b += 4;
            }
            while b < n {
                for (k, &value) in dot4_x1(rows, x(b), d_in, ahead).iter().enumerate() {
                    store(b, k, value);
                }
                b += 1;
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn dot4_x1<R: Row>(rows: [R; 4], x: *const f32, d_in: usize, ahead: usize) -> [f32; 4] {
        let zero = _mm512_setzero_ps();
        let (mut a0, mut a1, mut a2, mut a3) = (zero, zero, zero, zero);
        let mut c = 0;
        while c < d_in {
            if c % 64 == 0 {
                rows.iter().for_each(|r| r.fetch(c, ahead));
            }
            unsafe {
                let [w0, w1, w2, w3] = rows.map(|r| r.chunk32(c));
                for (h, (((w0, w1), w2), w3)) in w0.into_iter().zip(w1).zip(w2).zip(w3).enumerate()
                {
                    let x = _mm512_loadu_ps(x.add(c + 16 * h));
                    a0 = _mm512_fmadd_ps(w0, x, a0);
                    a1 = _mm512_fmadd_ps(w1, x, a1);
                    a2 = _mm512_fmadd_ps(w2, x, a2);
                    a3 = _mm512_fmadd_ps(w3, x, a3);
                }
            }
            c += 32;
        }
        let sums = sums16([
            a0, a1, a2, a3, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero,
        ]);
        [sums[0], sums[1], sums[2], sums[3]]
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn dot4_x4<R: Row>(
        rows: [R; 4],
        xs: [*const f32; 4],
        d_in: usize,
        ahead: usize,
    ) -> [[f32; 4]; 4] {
        let zero = _mm512_setzero_ps();
        let mut acc = [zero; 16];
        let mut c = 0;
        while c < d_in {
            if c % 64 == 0 {
                rows.iter().for_each(|r| r.fetch(c, ahead));
            }
            unsafe {
                let w = rows.map(|r| r.chunk32(c));
                for h in 0..2 {
                    for (v, x) in xs.iter().enumerate() {
                        let x = _mm512_loadu_ps(x.add(c + 16 * h));
                        for (r, w) in w.iter().enumerate() {
                            acc[4 * v + r] = _mm512_fmadd_ps(w[h], x, acc[4 * v + r]);
                        }
                    }
                }
            }
            c += 32;
        }
        let sums = sums16(acc);
        std::array::from_fn(|v| std::array::from_fn(|r| sums[4 * v + r]))
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn dot2_x8<R: Row>(
        rows: [R; 2],
        xs: [*const f32; 8],
        d_in: usize,
        ahead: usize,
    ) -> [[f32; 2]; 8] {
        let zero = _mm512_setzero_ps();
        let mut acc = [zero; 16];
        let mut c = 0;
        while c < d_in {
            if c % 64 == 0 {
                rows.iter().for_each(|r| r.fetch(c, ahead));
            }
            unsafe {
                let [w0, w1] = rows.map(|r| r.chunk32(c));
                for (h, (w0, w1)) in w0.into_iter().zip(w1).enumerate() {
                    for (v, x) in xs.iter().enumerate() {
                        let x = _mm512_loadu_ps(x.add(c + 16 * h));
                        acc[v] = _mm512_fmadd_ps(w0, x, acc[v]);
                        acc[8 + v] = _mm512_fmadd_ps(w1, x, acc[8 + v]);
                    }
                }
            }
            c += 32;
        }
        let sums = sums16(acc);
        std::array::from_fn(|v| [sums[v], sums[8 + v]])
    }
}
