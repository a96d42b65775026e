//! Prints the kernel tiers below the one this CPU runs (`cpu::detected`, ignoring
//! `RUNTIME_CPU`), highest first, a name a line: the builds `just test-tiers` tests besides
//! the CPU's own, which `just test` covers.

use kernels::cpu::{Tier, detected};

fn main() {
    let own = detected();
    for tier in Tier::ALL.into_iter().rev().filter(|&tier| tier < own) {
        println!("{tier}");
    }
}
