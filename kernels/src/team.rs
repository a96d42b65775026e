//! Spinning threads for the many short parallel regions of one decoded token.
//!
//! Decoding a token runs a parallel region per product and per layer's attention, most of
//! them short, with single-threaded work (norms, RoPE, residuals) between them. Between two
//! regions rayon's idle worker goes to sleep, and waking it (a futex, and on a VM an
//! interrupt to a halted vCPU) costs a good part of a short region: the caller does its
//! share, then waits for the other. A team keeps the pool's other threads spinning for the
//! length of one token, as llama.cpp's thread pool does for a graph, so each region starts on every thread at once.
//!
//! A region's work is a number of chunks claimed from a shared counter, so a region never
//! waits for a helper that has not arrived yet: whoever is there takes the chunks.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::thread::ThreadId;

/// Runs `work` on this thread while the other threads of the current rayon pool spin,
/// taking their part of each [`for_each_chunk`] that `work` calls.
///
/// Meant for short bursts of small regions, such as one decoded token: while `work` runs, the
/// helpers do nothing else, so rayon's own parallel operations inside it run on this thread
/// alone.
pub fn with_team<R>(work: impl FnOnce() -> R) -> R {
    let helpers = rayon::current_num_threads().saturating_sub(1);
    if helpers == 0 || !LEADING.get().is_null() {
        return work();
    }
    let team = Team {
        epoch: AtomicUsize::new(0),
        job: AtomicPtr::new(std::ptr::null_mut()),
        inside: AtomicUsize::new(0),
        closed: AtomicBool::new(false),
        leader: std::thread::current().id(),
    };
    rayon::in_place_scope(|scope| {
        for _ in 0..helpers {
            scope.spawn(|_| team.serve());
        }
        let _leading = Leading::start(&team);
        work()
    })
}

/// Calls `work(chunk)` for every chunk in `0..chunks`, in parallel: on the team this thread
/// leads if there is one (see [`with_team`]), else on the current rayon pool.
pub fn for_each_chunk(chunks: usize, work: &(dyn Fn(usize) + Sync)) {
    let team = LEADING.get();
    if team.is_null() || chunks < 2 {
        use rayon::prelude::*;
        (0..chunks).into_par_iter().for_each(work);
        return;
    }
    let job = Job {
        work,
        chunks,
        next: AtomicUsize::new(0),
        finished: AtomicUsize::new(0),
    };
    // SAFETY: LEADING points to the team of the enclosing `with_team` call, alive until it
    // returns, and is reset before it does (by `Leading`'s drop, even on a panic).
    unsafe { &*team }.run(&job);
}

/// Calls `work(part)` for each of `parts`, in parallel as [`for_each_chunk`] does.
pub fn for_each_part<T: Send>(parts: Vec<T>, work: impl Fn(T) + Sync) {
    // Each part is taken exactly once; the lock only shows the compiler that.
    let parts: Vec<Mutex<Option<T>>> = parts.into_iter().map(|p| Mutex::new(Some(p))).collect();
    for_each_chunk(parts.len(), &|i| {
        let part = parts[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(part) = part {
            work(part);
        }
    });
}

thread_local! {
    /// The team this thread leads while inside [`with_team`].
    static LEADING: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
}

/// One parallel region: `chunks` calls of `work`, claimed in order.
struct Job<'a> {
    work: &'a (dyn Fn(usize) + Sync),
    chunks: usize,
    next: AtomicUsize,
    finished: AtomicUsize,
}

impl Job<'_> {
    /// Claims and runs chunks until none is left.
    fn take_chunks(&self) {
        loop {
            let chunk = self.next.fetch_add(1, Ordering::Relaxed);
            if chunk >= self.chunks {
                return;
            }
            let abort = AbortOnUnwind;
            (self.work)(chunk);
            std::mem::forget(abort);
            self.finished.fetch_add(1, Ordering::Release);
        }
    }
}

/// A chunk that panics would leave its region waiting forever, or free the job while a
/// helper still reads it. The kernels run in chunks do not panic on the shapes the model
/// gives them; if one ever does, this ends the process with a message instead.
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        eprintln!("error: a parallel kernel panicked");
        std::process::abort();
    }
}

struct Team {
    /// Odd while a job is posted; each post and each withdrawal adds one.
    epoch: AtomicUsize,
    /// The posted job: valid while `epoch` is odd, and until `inside` is back to zero.
    job: AtomicPtr<Job<'static>>,
    /// Helpers that may be reading `job`.
    inside: AtomicUsize,
    /// Set when `with_team`'s work is over: helpers return.
    closed: AtomicBool,
    leader: ThreadId,
}

impl Team {
    /// A helper's loop: take chunks of every job posted until the team closes.
    fn serve(&self) {
        // Rayon may run a helper job nobody stole on the leader itself, once the work is done.
        if std::thread::current().id() == self.leader {
            return;
        }
        let mut served = 0;
        let mut idle_spins = 0u32;
        while !self.closed.load(Ordering::Acquire) {
            let epoch = self.epoch.load(Ordering::Acquire);
            // Even: nothing posted.
            if epoch == served || epoch.is_multiple_of(2) {
                idle_spins = idle_spins.wrapping_add(1);
                // Give the core away now and then, in case threads outnumber cores.
                if idle_spins.is_multiple_of(1 << 12) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            self.inside.fetch_add(1, Ordering::SeqCst);
            // Checked again after registering: see `run` for why this makes the read safe.
            if self.epoch.load(Ordering::SeqCst) == epoch {
                // SAFETY: the job is still posted, and `run` does not return (ending the
                // job's life) until this helper has left (`inside` back to zero).
                unsafe { &*self.job.load(Ordering::Acquire) }.take_chunks();
            }
            self.inside.fetch_sub(1, Ordering::Release);
            served = epoch;
        }
    }

    /// The leader's side of one region: post `job`, take chunks, wait for the rest, withdraw.
    fn run(&self, job: &Job) {
        // The lifetime is erased for the helpers; `job` outlives every use they make of it,
        // as the waits below ensure.
        self.job
            .store(job as *const Job as *mut Job<'static>, Ordering::Release);
        self.epoch.fetch_add(1, Ordering::SeqCst);
        job.take_chunks();
        while job.finished.load(Ordering::Acquire) < job.chunks {
            std::hint::spin_loop();
        }
        // A helper that saw the job posted either registered in `inside` before this
        // withdrawal (all SeqCst, so the load below sees it and waits for it to leave) or
        // sees the new epoch when it checks again after registering, and skips the job.
        self.epoch.fetch_add(1, Ordering::SeqCst);
        while self.inside.load(Ordering::SeqCst) != 0 {
            std::hint::spin_loop();
        }
    }
}

/// Marks this thread as the team's leader; on drop (also when `work` panics), unmarks it and
/// releases the helpers, so `with_team` can return.
struct Leading<'a>(&'a Team);

impl<'a> Leading<'a> {
    fn start(team: &'a Team) -> Self {
        LEADING.set(team);
        Self(team)
    }
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        LEADING.set(std::ptr::null());
        self.0.closed.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every chunk of every region runs exactly once, with and without a team, with more
    /// helpers than one, and when `with_team` is entered again from inside itself.
    #[test]
    fn every_chunk_runs_once() {
        let count_runs = |chunks: usize| {
            let runs: Vec<AtomicUsize> = (0..chunks).map(|_| AtomicUsize::new(0)).collect();
            for_each_chunk(chunks, &|chunk| {
                runs[chunk].fetch_add(1, Ordering::Relaxed);
            });
            runs.iter().all(|r| r.load(Ordering::Relaxed) == 1)
        };
        for threads in [1, 2, 3, 5] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool");
            pool.install(|| {
                assert!(count_runs(5), "outside a team");
                with_team(|| {
                    for region in 0..2000 {
                        assert!(count_runs(region % 7), "region {region}, {threads} threads");
                    }
                    assert!(with_team(|| count_runs(9)), "nested");
                });
            });
        }
    }

    #[test]
    fn a_panicking_leader_releases_its_helpers() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("a thread pool");
        pool.install(|| {
            let result = std::panic::catch_unwind(|| with_team(|| panic!("the work failed")));
            assert!(result.is_err());
            assert!(LEADING.get().is_null(), "still marked as leading");
        });
    }
}

/// An output buffer shared by the tasks of a parallel region that each write a disjoint
/// part of it (the prompt kernels: each task its own columns). Whoever makes one says which
/// part each task writes, and keeps the buffer alive and untouched otherwise meanwhile.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);

// SAFETY: the tasks sharing it write disjoint parts (see the type's promise).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The output's value `i` (a method, so that closures capture the whole `OutPtr`).
    pub(crate) fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}
