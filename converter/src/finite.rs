//! Every value the converter writes must be a number. A NaN or infinite weight (a corrupt
//! file, a bad quantizer, an overflow in whatever made the checkpoint) turns every logit it
//! reaches into NaN, and the model then generates garbage with exit 0; refused as it is
//! read (a GGUF's tensors as they are decoded, a checkpoint's as they are written), naming
//! the tensor and the place, it never reaches an artifact. Kept blocks are checked by their
//! scales where the weights file is written (`runtime::weights::file`).

use anyhow::{Result, bail};

/// Refuses the first NaN or infinite value of `values`, which start at element `first` of a
/// tensor whose rows hold `row_len` values.
pub fn check_values(values: &[f32], first: usize, row_len: usize) -> Result<()> {
    match values.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(i) => {
            let at = first + i;
            let row_len = row_len.max(1);
            bail!(
                "its value at row {}, column {} is {}",
                at / row_len,
                at % row_len,
                values[i]
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_non_finite_value_is_named_by_its_place() {
        assert!(check_values(&[0.0, -1.5, f32::MAX], 0, 2).is_ok());
        let error = check_values(&[0.0, 1.0, f32::NAN, f32::INFINITY], 6, 4).unwrap_err();
        assert_eq!(error.to_string(), "its value at row 2, column 0 is NaN");
        let error = check_values(&[f32::NEG_INFINITY], 3, 4).unwrap_err();
        assert_eq!(error.to_string(), "its value at row 0, column 3 is -inf");
    }
}
