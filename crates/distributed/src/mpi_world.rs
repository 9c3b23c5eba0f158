//! The MPI side of [`crate::World`]: rsmpi over the world communicator.

use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;
use mpi::{Count, Threading};

use crate::Error;

pub(crate) struct MpiWorld {
    world: SimpleCommunicator,
    // Dropped last: MPI_Finalize.
    _universe: Universe,
}

impl MpiWorld {
    /// MPI_Init_thread at "funneled": only the main thread calls MPI, while Ember's compute
    /// threads (and the watchdog, which never calls MPI) run beside it.
    pub(crate) fn init() -> Result<Self, Error> {
        let (universe, provided) =
            mpi::initialize_with_threading(Threading::Funneled).ok_or(Error::AlreadyInitialised)?;
        if provided < Threading::Funneled {
            return Err(Error::ThreadLevel {
                provided: format!("{provided:?}"),
                needed: "Funneled".into(),
            });
        }
        Ok(MpiWorld {
            world: universe.world(),
            _universe: universe,
        })
    }

    pub(crate) fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    pub(crate) fn size(&self) -> usize {
        self.world.size() as usize
    }

    // rsmpi has no MPI_IN_PLACE: reduce from a copy.
    pub(crate) fn all_reduce_sum_f32(&self, buf: &mut [f32]) {
        let send = buf.to_vec();
        self.world.all_reduce_into(&send[..], buf, SystemOperation::sum());
    }

    pub(crate) fn all_reduce_sum_f64(&self, buf: &mut [f64]) {
        let send = buf.to_vec();
        self.world.all_reduce_into(&send[..], buf, SystemOperation::sum());
    }

    pub(crate) fn all_reduce_max_i64(&self, buf: &mut [i64]) {
        let send = buf.to_vec();
        self.world.all_reduce_into(&send[..], buf, SystemOperation::max());
    }

    pub(crate) fn all_gather_u64(&self, value: u64, out: &mut [u64]) {
        self.world.all_gather_into(&value, out);
    }

    /// Every rank's bytes, in rank order: the lengths first, then MPI_Allgatherv.
    pub(crate) fn all_gather_bytes(&self, bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut lengths = vec![0u64; self.size()];
        self.world
            .all_gather_into(&(bytes.len() as u64), &mut lengths[..]);
        let counts: Vec<Count> = lengths.iter().map(|&n| n as Count).collect();
        let displs: Vec<Count> = counts
            .iter()
            .scan(0, |at, &n| {
                let start = *at;
                *at += n;
                Some(start)
            })
            .collect();
        let mut all = vec![0u8; lengths.iter().sum::<u64>() as usize];
        {
            let mut parts = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
            self.world.all_gather_varcount_into(bytes, &mut parts);
        }
        counts
            .iter()
            .zip(&displs)
            .map(|(&n, &d)| all[d as usize..(d + n) as usize].to_vec())
            .collect()
    }

    pub(crate) fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }
}
