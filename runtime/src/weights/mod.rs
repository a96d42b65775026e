//! The weights on disk and their way into the model: the artifact's manifest ([`manifest`]),
//! Burn's record read over a memory map ([`record`]) and its burnpack copy ([`burnpack`]),
//! the layout the kernels read ([`layout`]), the weights file that holds that layout
//! ([`file`]), loading any of them into the model ([`load`]), and opening an artifact
//! directory ([`artifact`]).
//!
//! Uses [`crate::model`] and [`crate::util`].

pub mod artifact;
pub mod burnpack;
pub mod file;
pub mod layout;
pub mod load;
pub mod manifest;
pub mod record;
