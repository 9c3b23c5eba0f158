//! Who this process is in a data-parallel job, and the collectives it takes part in.
//!
//! A job is started by a launcher — `mpirun -np N ember train …`, or Slurm's
//! `srun --mpi=pmix ember train …` — and each process learns its rank and the world size from
//! MPI's world communicator. A process started without a launcher is a world of one: every
//! collective leaves its buffer as it is, and MPI is never initialised. MPI itself is behind the
//! `mpi` feature, so the default build needs no MPI library.
//!
//! Ember talks MPI and nothing of its own: the sums are `MPI_Allreduce`, which Open MPI runs over
//! shared memory on one machine and over the interconnect between machines.
//!
//! Every collective runs under a [`Watchdog`]: a peer that died or hangs would otherwise block
//! the others for ever inside MPI. When a collective has waited longer than the timeout, the
//! watchdog prints which collective, which rank and how long, and ends the process; the launcher
//! then ends the job (`mpirun` at once; Slurm with `srun --kill-on-bad-exit=1`). A rank that
//! dies outright is reported by the launcher itself, which names it.
//!
//! ```
//! use ember_distributed::World;
//! // Started without a launcher: a world of one, and MPI is never initialised.
//! let world = World::single();
//! assert_eq!((world.rank(), world.size(), world.is_leader()), (0, 1, true));
//! let mut gradients = vec![1.5f32, -2.0];
//! world.all_reduce_sum_f32(&mut gradients, "gradients"); // the sum over one rank
//! assert_eq!(gradients, [1.5, -2.0]);
//! ```

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[cfg(feature = "mpi")]
mod mpi_world;

/// Exit status of a process whose collective timed out (as `timeout(1)`).
pub const TIMEOUT_EXIT: i32 = 124;

/// Why this process cannot join the job it was started in.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "started by {launcher} as rank {rank} of {size}, but this ember was built without MPI; \
         rebuild with `cargo build --release --features distributed` (needs Debian's \
         libopenmpi-dev and libclang-dev) or start it without a launcher"
    )]
    NoMpi {
        launcher: &'static str,
        rank: usize,
        size: usize,
    },
    #[error(
        "srun started {tasks} tasks without an MPI plugin, so they cannot find each other; \
         start them with `srun --mpi=pmix …` (or run one task)"
    )]
    SrunWithoutMpi { tasks: usize },
    #[error("MPI is already initialised in this process; a process joins one job once")]
    AlreadyInitialised,
    #[error("MPI offers thread level {provided} but Ember needs {needed} (collectives from the main thread, compute on worker threads)")]
    ThreadLevel { provided: String, needed: String },
}

/// The launcher that started this process, from the environment it set: its name, rank and
/// world size. `Ok(None)`: no launcher (a world of one).
pub fn launcher_from_env(
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<(&'static str, usize, usize)>, Error> {
    let num = |k: &str| env(k).and_then(|v| v.trim().parse::<usize>().ok());
    // Open MPI's mpirun sets OMPI_COMM_WORLD_*; PMIx (Open MPI 4+, srun --mpi=pmix) PMIX_RANK;
    // PMI-1/2 (MPICH's hydra, srun --mpi=pmi2) PMI_RANK and PMI_SIZE.
    if let (Some(rank), Some(size)) = (num("OMPI_COMM_WORLD_RANK"), num("OMPI_COMM_WORLD_SIZE")) {
        return Ok(Some(("mpirun", rank, size)));
    }
    if let Some(rank) = num("PMIX_RANK") {
        let size = num("SLURM_STEP_NUM_TASKS")
            .or_else(|| num("SLURM_NTASKS"))
            .unwrap_or(0);
        return Ok(Some(("PMIx", rank, size)));
    }
    if let (Some(rank), Some(size)) = (num("PMI_RANK"), num("PMI_SIZE")) {
        return Ok(Some(("PMI", rank, size)));
    }
    // srun without --mpi: every task would train alone, all into the same run directory.
    if let Some(tasks) = num("SLURM_STEP_NUM_TASKS").filter(|&n| n > 1) {
        if env("SLURM_STEP_ID").is_some() {
            return Err(Error::SrunWithoutMpi { tasks });
        }
    }
    Ok(None)
}

/// This process's place in the job: a world of one, or a rank of an MPI job.
pub struct World {
    rank: usize,
    size: usize,
    launcher: Option<&'static str>,
    #[cfg(feature = "mpi")]
    mpi: Option<mpi_world::MpiWorld>,
    /// None without a launcher: no collectives to watch.
    watchdog: Option<Watchdog>,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("launcher", &self.launcher)
            .finish()
    }
}

impl World {
    /// A world of one: no launcher, no MPI.
    pub fn single() -> Self {
        World {
            rank: 0,
            size: 1,
            launcher: None,
            #[cfg(feature = "mpi")]
            mpi: None,
            watchdog: None,
        }
    }

    /// Joins the job the launcher started (MPI's world communicator), or returns a world of one
    /// when no launcher started this process. `timeout`: how long any collective may wait for
    /// the other ranks before this process gives up (see the module docs).
    pub fn from_launcher(timeout: Duration) -> Result<Self, Error> {
        let Some((launcher, rank, size)) = launcher_from_env(|k| std::env::var(k).ok())? else {
            return Ok(Self::single());
        };
        #[cfg(feature = "mpi")]
        {
            let _ = (rank, size);
            let mpi = mpi_world::MpiWorld::init()?;
            let (rank, size) = (mpi.rank(), mpi.size());
            Ok(World {
                rank,
                size,
                launcher: Some(launcher),
                mpi: Some(mpi),
                watchdog: Some(Watchdog::new(timeout, rank)),
            })
        }
        #[cfg(not(feature = "mpi"))]
        {
            let _ = timeout;
            if size <= 1 {
                return Ok(Self::single());
            }
            Err(Error::NoMpi { launcher, rank, size })
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Rank 0: the one process that writes the run directory and prints progress.
    pub fn is_leader(&self) -> bool {
        self.rank == 0
    }

    /// Whether a launcher started this process (then even a world of one takes part in MPI's
    /// collectives, which lets `mpirun -np 1` run every rank's code path).
    pub fn is_launched(&self) -> bool {
        self.launcher.is_some()
    }

    /// What started the job (`mpirun`, `PMIx`, `PMI`), if anything.
    pub fn launcher(&self) -> Option<&'static str> {
        self.launcher
    }

    /// Sums `buf` element-wise over all ranks, in place. `what` names the collective in the
    /// watchdog's message (`"the gradients of step 12 (bucket 2 of 3)"`).
    pub fn all_reduce_sum_f32(&self, buf: &mut [f32], what: &str) {
        #[cfg(feature = "mpi")]
        self.collective(what, |m| m.all_reduce_sum_f32(buf));
        #[cfg(not(feature = "mpi"))]
        let _ = (buf, what);
    }

    /// Sums `buf` element-wise over all ranks, in place.
    pub fn all_reduce_sum_f64(&self, buf: &mut [f64], what: &str) {
        #[cfg(feature = "mpi")]
        self.collective(what, |m| m.all_reduce_sum_f64(buf));
        #[cfg(not(feature = "mpi"))]
        let _ = (buf, what);
    }

    /// Element-wise maximum over all ranks, in place.
    pub fn all_reduce_max_i64(&self, buf: &mut [i64], what: &str) {
        #[cfg(feature = "mpi")]
        self.collective(what, |m| m.all_reduce_max_i64(buf));
        #[cfg(not(feature = "mpi"))]
        let _ = (buf, what);
    }

    /// Every rank's `value`, in rank order, on every rank.
    pub fn all_gather_u64(&self, value: u64, what: &str) -> Vec<u64> {
        #[cfg_attr(not(feature = "mpi"), allow(unused_mut))]
        let mut out = vec![value; self.size];
        #[cfg(feature = "mpi")]
        self.collective(what, |m| m.all_gather_u64(value, &mut out));
        #[cfg(not(feature = "mpi"))]
        let _ = what;
        out
    }

    /// Every rank's `bytes` (of any length), in rank order, on every rank. Ranks beyond 2³¹
    /// bytes in all are not supported (MPI counts are 32-bit).
    pub fn all_gather_bytes(&self, bytes: &[u8], what: &str) -> Vec<Vec<u8>> {
        #[cfg_attr(not(feature = "mpi"), allow(unused_mut))]
        let mut out = vec![bytes.to_vec()];
        #[cfg(feature = "mpi")]
        self.collective(what, |m| out = m.all_gather_bytes(bytes));
        #[cfg(not(feature = "mpi"))]
        let _ = what;
        out
    }

    /// Runs `f` (which waits on the other ranks some other way: a device synchronisation after an
    /// NCCL collective) under the watchdog.
    pub fn watch<T>(&self, what: &str, f: impl FnOnce() -> T) -> T {
        match &self.watchdog {
            Some(dog) => {
                let _armed = dog.arm(what);
                f()
            }
            None => f(),
        }
    }

    /// Ends the whole job at once (`MPI_Abort`): for an error on one rank that the others cannot
    /// know about and would otherwise wait for. In a world of one, exits with `code`.
    pub fn abort(&self, code: i32) -> ! {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            m.abort(code);
        }
        std::process::exit(code)
    }

    /// Runs `f` on the MPI world under the watchdog; nothing in a world of one.
    #[cfg(feature = "mpi")]
    fn collective(&self, what: &str, f: impl FnOnce(&mpi_world::MpiWorld)) {
        if let (Some(dog), Some(mpi)) = (&self.watchdog, &self.mpi) {
            let _armed = dog.arm(what);
            f(mpi);
        }
    }
}

/// Ends this process when a collective waits longer than the timeout.
///
/// A thread sleeps until the deadline of the collective in progress (if any); the main thread
/// arms it before each collective and disarms it after, which costs a mutex and a condvar
/// notification — nothing next to a collective.
pub struct Watchdog {
    timeout: Duration,
    shared: Arc<(Mutex<Armed>, Condvar)>,
}

#[derive(Default)]
struct Armed {
    /// Deadline, timeout and description of the collective in progress.
    current: Option<(Instant, Duration, String)>,
    /// Counts arm() calls, so the thread can tell a new collective from the one it slept on.
    generation: u64,
}

impl Watchdog {
    pub fn new(timeout: Duration, rank: usize) -> Self {
        let shared = Arc::new((Mutex::new(Armed::default()), Condvar::new()));
        let watched = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("ember-watchdog".into())
            .spawn(move || Self::watch(&watched, rank));
        // Without the thread there is no timeout, but the collectives still work.
        if let Err(e) = spawned {
            let _ = writeln!(std::io::stderr(), "rank {rank}: warning: cannot start the collective watchdog ({e}); a dead peer may hang this rank");
        }
        Watchdog { timeout, shared }
    }

    /// Starts the clock for one collective; it stops when the guard drops.
    pub fn arm(&self, what: &str) -> ArmedGuard<'_> {
        let (lock, cv) = &*self.shared;
        let mut armed = lock.lock().unwrap_or_else(|p| p.into_inner());
        armed.generation += 1;
        let deadline = Instant::now().checked_add(self.timeout);
        armed.current = deadline.map(|d| (d, self.timeout, what.to_string()));
        cv.notify_one();
        ArmedGuard { dog: self }
    }

    fn disarm(&self) {
        let (lock, _) = &*self.shared;
        lock.lock().unwrap_or_else(|p| p.into_inner()).current = None;
    }

    fn watch(shared: &(Mutex<Armed>, Condvar), rank: usize) {
        let (lock, cv) = shared;
        let mut armed = lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match armed.current.clone() {
                None => armed = cv.wait(armed).unwrap_or_else(|p| p.into_inner()),
                Some((deadline, timeout, what)) => {
                    let now = Instant::now();
                    if now >= deadline {
                        // A write that fails (stderr gone) must not keep this thread from ending
                        // the rank: no panicking eprintln!.
                        let _ = writeln!(
                            std::io::stderr(),
                            "rank {rank}: {what}: the other ranks did not take part within {} s (distributed.timeout_secs); \
                             a rank has died or hangs. Ending this rank so that the launcher ends the job; \
                             resume from the newest checkpoint with --resume.",
                            timeout.as_secs()
                        );
                        // _exit: no atexit handlers, which could wait on MPI's own shutdown.
                        unsafe { libc::_exit(TIMEOUT_EXIT) };
                    }
                    let generation = armed.generation;
                    let (guard, _) = cv
                        .wait_timeout_while(armed, deadline - now, |a| {
                            a.generation == generation && a.current.is_some()
                        })
                        .unwrap_or_else(|p| p.into_inner());
                    armed = guard;
                }
            }
        }
    }
}

/// Disarms the watchdog when the collective is over.
pub struct ArmedGuard<'a> {
    dog: &'a Watchdog,
}

impl Drop for ArmedGuard<'_> {
    fn drop(&mut self) {
        self.dog.disarm();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn no_launcher_is_a_world_of_one() {
        assert!(launcher_from_env(env(&[("SLURM_JOB_ID", "7")]))
            .unwrap()
            .is_none());
        // One srun task without an MPI plugin is an ordinary single process.
        assert!(
            launcher_from_env(env(&[("SLURM_STEP_NUM_TASKS", "1"), ("SLURM_STEP_ID", "0")]))
                .unwrap()
                .is_none()
        );
        let w = World::single();
        assert_eq!((w.rank(), w.size(), w.is_leader()), (0, 1, true));
        let mut buf = [1.5f32, -2.0];
        w.all_reduce_sum_f32(&mut buf, "test");
        assert_eq!(buf, [1.5, -2.0]);
        assert_eq!(w.all_gather_u64(9, "test"), [9]);
    }

    #[test]
    fn launchers_are_recognised_by_their_environment() {
        let mpirun = [
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("PMIX_RANK", "1"),
        ];
        assert_eq!(launcher_from_env(env(&mpirun)).unwrap(), Some(("mpirun", 1, 3)));
        let srun = [
            ("PMIX_RANK", "2"),
            ("SLURM_STEP_NUM_TASKS", "4"),
            ("SLURM_STEP_ID", "0"),
        ];
        assert_eq!(launcher_from_env(env(&srun)).unwrap(), Some(("PMIx", 2, 4)));
        let hydra = [("PMI_RANK", "0"), ("PMI_SIZE", "2")];
        assert_eq!(launcher_from_env(env(&hydra)).unwrap(), Some(("PMI", 0, 2)));
    }

    #[test]
    fn srun_tasks_without_an_mpi_plugin_are_refused_with_the_fix() {
        let e = launcher_from_env(env(&[("SLURM_STEP_NUM_TASKS", "2"), ("SLURM_STEP_ID", "0")])).unwrap_err();
        assert!(e.to_string().contains("srun --mpi=pmix"), "{e}");
    }

    #[cfg(not(feature = "mpi"))]
    #[test]
    fn a_launched_process_without_mpi_is_told_how_to_rebuild() {
        // The environment of this test process is not a launcher's; check the message itself.
        let e = Error::NoMpi {
            launcher: "mpirun",
            rank: 1,
            size: 2,
        };
        assert!(e.to_string().contains("--features distributed"), "{e}");
    }

    #[test]
    fn the_watchdog_stays_quiet_while_collectives_finish_in_time() {
        let dog = Watchdog::new(Duration::from_millis(200), 0);
        for _ in 0..50 {
            let _armed = dog.arm("quick");
            std::thread::sleep(Duration::from_millis(5));
        }
        // Disarmed: waiting beyond the timeout outside a collective ends nothing.
        std::thread::sleep(Duration::from_millis(400));
    }
}
