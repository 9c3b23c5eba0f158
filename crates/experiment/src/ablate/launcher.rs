//! A sweep starts every run itself (as a child process, or in its own process), so it refuses to
//! start inside a job step that another launcher made: under `mpirun` (or `srun --mpi`) each of
//! its runs would take the job's environment and try to join an MPI world it is no rank of, and
//! under `srun` every task of the step would run the whole sweep. A Slurm *batch* script is no
//! step (no `SLURM_STEP_ID`), which is where `--launcher slurm` runs its cells.

use anyhow::{bail, Result};

/// Refuses to start a sweep (or one of its cells) when `env` is a job step's: an MPI launcher's
/// (`OMPI_COMM_WORLD_*`, `PMIX_RANK`, `PMI_RANK`) or Slurm's (`SLURM_STEP_ID`, set by `srun`).
/// The refusal names the launcher and the variables that show it.
pub fn refuse_foreign_launcher(env: impl Fn(&str) -> Option<String>) -> Result<()> {
    let shown = |vars: &[&str]| -> String {
        vars.iter()
            .filter_map(|v| env(v).map(|value| format!("{v}={value}")))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let launcher = ember_distributed::launcher_from_env(&env);
    let what = match launcher {
        Ok(Some(("mpirun", ..))) => Some((
            "an MPI job started by mpirun",
            shown(&["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"]),
        )),
        Ok(Some(("PMIx", ..))) => Some((
            "an MPI job (PMIx: mpirun, or srun --mpi=pmix)",
            shown(&["PMIX_RANK", "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS"]),
        )),
        Ok(Some(_)) => Some((
            "an MPI job (PMI: MPICH's mpiexec, or srun --mpi=pmi2)",
            shown(&["PMI_RANK", "PMI_SIZE"]),
        )),
        _ if env("SLURM_STEP_ID").is_some() => Some((
            "a Slurm job step (srun)",
            shown(&["SLURM_STEP_ID", "SLURM_JOB_ID", "SLURM_STEP_NUM_TASKS"]),
        )),
        _ => None,
    };
    if let Some((what, vars)) = what {
        bail!(
            "ember ablate is running inside {what} ({vars}), which it did not start: it starts each \
             run as a process of its own, which would take that job's environment (joining an MPI \
             world it is no rank of, or every task running the whole sweep). Run `ember ablate` \
             outside the job step: on a login node, or in the batch script itself (not under \
             mpirun or srun); to spread a sweep over a cluster, plan it with --launcher slurm. \
             Nothing was started."
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn a_sweep_refuses_a_job_step_it_did_not_start_and_names_it() {
        for (vars, says) in [
            (
                &[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "1")][..],
                "OMPI_COMM_WORLD_SIZE=1",
            ),
            (&[("PMIX_RANK", "0")][..], "PMIX_RANK=0"),
            (&[("PMI_RANK", "1"), ("PMI_SIZE", "2")][..], "PMI_SIZE=2"),
            (
                &[("SLURM_STEP_ID", "0"), ("SLURM_JOB_ID", "77")][..],
                "SLURM_STEP_ID=0, SLURM_JOB_ID=77",
            ),
            (
                &[("SLURM_STEP_ID", "3"), ("SLURM_STEP_NUM_TASKS", "4")][..],
                "a Slurm job step",
            ),
        ] {
            let e = refuse_foreign_launcher(env(vars)).unwrap_err().to_string();
            assert!(
                e.contains(says) && e.contains("Nothing was started"),
                "{vars:?}: {e}"
            );
        }
        // A Slurm batch script (the cells of --launcher slurm) and a plain shell are not steps.
        refuse_foreign_launcher(env(&[("SLURM_JOB_ID", "77"), ("SLURM_ARRAY_TASK_ID", "3")])).unwrap();
        refuse_foreign_launcher(env(&[])).unwrap();
    }
}
