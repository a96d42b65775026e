//! How much more memory this process may take: what sizes a KV cache, decides whether the
//! weights are read into memory, and bounds `runtime serve`'s caches. A container's limit
//! counts as well as the machine's: /proc/meminfo inside a container shows the host's
//! memory, and a process sized by it alone is killed at its cgroup's limit.

use std::path::Path;

/// The lesser of the machine's `MemAvailable` and the headroom of this process's memory
/// cgroup and of each cgroup above it (its limit less what it uses, not counting the page
/// cache, which the kernel reclaims before it kills); `None` where neither can be read.
pub fn available() -> Option<u64> {
    let machine = machine_available();
    let cgroups = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|cgroups| cgroup_headroom(Path::new("/sys/fs/cgroup"), &cgroups));
    match (machine, cgroups) {
        (Some(machine), Some(cgroups)) => Some(machine.min(cgroups)),
        (machine, cgroups) => machine.or(cgroups),
    }
}

/// `MemAvailable` of /proc/meminfo, in bytes.
fn machine_available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The least headroom of the memory cgroups that `cgroups` (the text of /proc/self/cgroup)
/// places this process in, and their ancestors, with the hierarchies mounted under `root`:
/// cgroup v2's `memory.max` and `memory.current` (the line `0::PATH`), or v1's
/// `memory.limit_in_bytes` and `memory.usage_in_bytes` (the line naming `memory`). A limit
/// of "max" (v2) or v1's near-2^63 for none leaves a cgroup out.
fn cgroup_headroom(root: &Path, cgroups: &str) -> Option<u64> {
    let mut least: Option<u64> = None;
    for line in cgroups.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (mount, files) = if controllers.is_empty() {
            (root.to_path_buf(), V2)
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), V1)
        } else {
            continue;
        };
        let mut dir = mount.join(path.trim_start_matches('/'));
        loop {
            if let Some(headroom) = headroom(&dir, files) {
                least = Some(least.map_or(headroom, |least| least.min(headroom)));
            }
            if dir == mount || !dir.pop() {
                break;
            }
        }
    }
    least
}

/// A cgroup version's files: the limit, the usage, and the lines of memory.stat counting
/// the page cache on the kernel's two lists of file pages.
#[derive(Clone, Copy)]
struct Files {
    limit: &'static str,
    usage: &'static str,
    page_cache: [&'static str; 2],
}

const V2: Files = Files {
    limit: "memory.max",
    usage: "memory.current",
    page_cache: ["active_file", "inactive_file"],
};

const V1: Files = Files {
    limit: "memory.limit_in_bytes",
    usage: "memory.usage_in_bytes",
    page_cache: ["total_active_file", "total_inactive_file"],
};

/// No real limit: v1 writes "none" as the largest page multiple below 2^63.
const NO_LIMIT: u64 = 1 << 62;

/// The cgroup at `dir`'s limit less its usage (without its page cache), if it has a limit.
fn headroom(dir: &Path, files: Files) -> Option<u64> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let limit: u64 = read(files.limit)?.trim().parse().ok()?; // "max" fails: no limit
    if limit >= NO_LIMIT {
        return None;
    }
    let usage: u64 = read(files.usage)?.trim().parse().ok()?;
    let stat = read("memory.stat").unwrap_or_default();
    let page_cache: u64 = (stat.lines())
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let name = words.next()?;
            (files.page_cache.contains(&name)).then(|| words.next()?.parse::<u64>().ok())?
        })
        .sum();
    Some(limit.saturating_sub(usage.saturating_sub(page_cache)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }

    /// v2: the process's cgroup and its parent each limit; the tighter one counts, and
    /// page cache is headroom. "max" is no limit.
    #[test]
    fn a_v2_cgroup_and_its_parents_bound_the_headroom() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        write(
            &root.join("box"),
            &[("memory.max", "1000000\n"), ("memory.current", "300000\n")],
        );
        write(
            &root.join("box/app"),
            &[
                ("memory.max", "2000000\n"),
                ("memory.current", "250000\n"),
                (
                    "memory.stat",
                    "anon 100000\ninactive_file 50000\nactive_file 7\nfile 9\n",
                ),
            ],
        );
        assert_eq!(cgroup_headroom(root, "0::/box/app\n"), Some(700_000));
        write(&root.join("box"), &[("memory.max", "max\n")]);
        assert_eq!(cgroup_headroom(root, "0::/box/app\n"), Some(1_800_007));
        assert_eq!(cgroup_headroom(root, "0::/\n"), None);
    }

    /// v1: the memory controller's line is read, others are not; v1's "no limit" is none.
    #[test]
    fn a_v1_memory_cgroup_bounds_the_headroom() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        write(
            &root.join("memory/docker/abc"),
            &[
                ("memory.limit_in_bytes", "536870912\n"),
                ("memory.usage_in_bytes", "136870912\n"),
                (
                    "memory.stat",
                    "cache 1\ntotal_inactive_file 1000\ntotal_active_file 20\n",
                ),
            ],
        );
        write(
            &root.join("memory"),
            &[
                ("memory.limit_in_bytes", "9223372036854771712\n"),
                ("memory.usage_in_bytes", "14190010368\n"),
            ],
        );
        let cgroups = "5:devices:/docker/abc\n4:memory:/docker/abc\n0::/\n";
        assert_eq!(cgroup_headroom(root, cgroups), Some(400_001_020));
        assert_eq!(cgroup_headroom(root, "4:cpu,cpuacct:/docker/abc\n"), None);
    }

    /// On any Linux host: some memory is available, no more than the machine's (give or
    /// take what other processes free meanwhile).
    #[test]
    fn available_is_at_most_the_machines() {
        let available = available().unwrap();
        let machine = machine_available().expect("a /proc/meminfo");
        assert!(available > 0 && available <= machine + (256 << 20));
    }
}
