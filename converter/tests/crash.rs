//! Crash safety: a conversion killed with SIGKILL at any moment leaves nothing that
//! `converter verify` accepts or the runtime loads, except a complete artifact (the one
//! that was there before, or the new one if the kill came after the commit).

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use runtime::FlexBackend;
use runtime::weights::artifact::load_model;
use safetensors::Dtype;

/// Kill points per scenario, spread evenly over one uninterrupted conversion's duration.
const KILL_POINTS: u32 = 24;

/// A checkpoint large enough that converting it takes a while (a 200k-token f32 vocabulary,
/// untied: ~13 MB of weights), so kills land in every phase.
fn write_slow_checkpoint(dir: &Path) {
    write_checkpoint(
        dir,
        Spec {
            dtype: Dtype::F32,
            tied: false,
            shards: 1,
        },
    );
    let vocab = 200_000;
    let mut config = config_json(false);
    config["vocab_size"] = serde_json::json!(vocab);
    write_json(&dir.join("config.json"), &config);
    let tensors: Vec<RawTensor> = tensor_shapes(false)
        .into_iter()
        .map(|(name, mut shape)| {
            if name.ends_with("embed_tokens.weight") || name == "lm_head.weight" {
                shape[0] = vocab;
            }
            let bytes = vec![0x3c; shape.iter().product::<usize>() * 4];
            (name, shape, bytes)
        })
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &tensors, Dtype::F32);
}

fn convert_command(src: &Path, out: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_converter"));
    command
        .args(["convert".as_ref(), src.as_os_str(), out.as_os_str()])
        .stderr(Stdio::null());
    command
}

/// Whatever a killed run left in `out`: a manifest (which `verify` accepts and the runtime
/// loads) or no manifest (which neither accepts). Returns whether it is complete.
fn check_invariant(out: &Path, label: &str) -> bool {
    let has_manifest = out.join("manifest.json").exists();
    let verified = converter(&[&"verify", &out]).success;
    let loads = load_model::<FlexBackend>(out, &Default::default()).is_ok();
    assert_eq!(
        has_manifest, verified,
        "{label}: manifest present = {has_manifest}, verify passed = {verified}"
    );
    assert_eq!(
        verified, loads,
        "{label}: verify passed = {verified}, runtime loaded = {loads}"
    );
    verified
}

#[test]
fn sigkill_at_any_point_leaves_nothing_that_passes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("hf");
    write_slow_checkpoint(&src);

    // One uninterrupted run sets the time scale.
    let reference = tmp.path().join("reference");
    let started = Instant::now();
    assert!(
        convert_command(&src, &reference)
            .status()
            .unwrap()
            .success()
    );
    let full = started.elapsed();

    for with_previous in [false, true] {
        for point in 0..KILL_POINTS {
            let out = tmp.path().join(format!("out-{with_previous}-{point}"));
            if with_previous {
                assert!(convert_command(&src, &out).status().unwrap().success());
            }
            let delay = full.mul_f64(f64::from(point) / f64::from(KILL_POINTS));
            let delay = kill_mid_way(&src, &out, delay, with_previous);
            let label = format!("killed after {delay:?} (previous artifact: {with_previous})");
            check_invariant(&out, &label);
            // The next run recovers whatever was left.
            assert!(convert_command(&src, &out).status().unwrap().success());
            assert!(check_invariant(&out, &format!("{label}, then rerun")));
            assert!(!out.join(".partial").exists());
            std::fs::remove_dir_all(&out).unwrap();
        }
    }
    eprintln!(
        "{} runs killed mid-way; a full run takes {full:?}",
        2 * KILL_POINTS
    );
}

/// Starts a conversion into `out` and kills it with SIGKILL after `delay`. A conversion
/// that finished first (a faster run than the one that set the time scale) is undone, back
/// to the scenario's starting state, and tried again with half the delay, so every kill
/// point lands while a conversion runs, whatever the machine's speed. Returns the delay
/// that did.
fn kill_mid_way(src: &Path, out: &Path, mut delay: Duration, with_previous: bool) -> Duration {
    for _ in 0..12 {
        let mut child = convert_command(src, out).spawn().unwrap();
        std::thread::sleep(delay);
        child.kill().unwrap(); // SIGKILL; a no-op error-free call if it already exited
        let status = child.wait().unwrap();
        if status.signal() == Some(libc::SIGKILL) {
            return delay;
        }
        assert!(status.success(), "an unkilled conversion failed: {status}");
        if !with_previous {
            std::fs::remove_dir_all(out).unwrap();
        }
        delay /= 2;
    }
    panic!("the conversion always finished before the kill, even after {delay:?}");
}
