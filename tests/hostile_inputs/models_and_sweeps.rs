//! The table's cases for imported and packaged models, the files of an import folder, the
//! switches that change a run's bits, the launchers a sweep did not start, and sweeps that were
//! moved (issue 53). The fixture adds `hf/` (the run exported for transformers), `ft.yaml` (a
//! fine-tune that starts from it with `model.init_from: hf`) and `ft/`, trained from it.

use super::*;

/// The header of the safetensors file `path`, and where its tensors' bytes start.
fn st_header(path: &Path) -> (serde_json::Map<String, serde_json::Value>, usize) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header, 8 + n)
}

/// Writes `header` and `data` (the tensors' bytes) as the safetensors file `path`.
fn st_write(path: &Path, header: &serde_json::Map<String, serde_json::Value>, data: &[u8]) {
    let json = serde_json::to_vec(header).unwrap();
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend(json);
    out.extend(data);
    std::fs::write(path, out).unwrap();
}

/// The names of the tensors in the safetensors file `path`.
fn st_names(path: &Path) -> Vec<String> {
    st_header(path)
        .0
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect()
}

/// Writes `dir/model.safetensors.index.json`, putting every tensor of `dir/model.safetensors`
/// in the shard `shard`.
fn write_index(dir: &Path, shard: &str) {
    let map: serde_json::Map<String, serde_json::Value> = st_names(&dir.join("model.safetensors"))
        .into_iter()
        .map(|n| (n, shard.into()))
        .collect();
    let index = serde_json::json!({ "metadata": {}, "weight_map": map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

/// Puts a NaN into the first value of the f32 tensor `name` of `path`.
fn poison(path: &Path, name: &str) {
    let (header, start) = st_header(path);
    let offset = header[name]["data_offsets"][0].as_u64().unwrap() as usize;
    let mut bytes = std::fs::read(path).unwrap();
    bytes[start + offset..start + offset + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(path, bytes).unwrap();
}

/// Adds the f32 tensor `name` (all `value`) of `shape` to the safetensors file `path`.
fn add_tensor(path: &Path, name: &str, shape: &[usize], value: f32) {
    let (mut header, start) = st_header(path);
    let mut data = std::fs::read(path).unwrap()[start..].to_vec();
    let n: usize = shape.iter().product();
    let end = data.len();
    header.insert(
        name.into(),
        serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [end, end + 4 * n]}),
    );
    for _ in 0..n {
        data.extend(value.to_le_bytes());
    }
    st_write(path, &header, &data);
}

/// A copy of the fixture's `hf/` as `name/`, and `name.yaml`, a fine-tune starting from it.
fn import_copy(d: &Path, name: &str) -> PathBuf {
    let dir = d.join(name);
    copy_dir(&d.join("hf"), &dir);
    let yaml = std::fs::read_to_string(d.join("ft.yaml"))
        .unwrap()
        .replace("init_from: hf", &format!("init_from: {name}"));
    std::fs::write(d.join(format!("{name}.yaml")), yaml).unwrap();
    dir
}

/// `import_copy`, with `file` in it replaced by a FIFO nothing writes into.
fn import_with_fifo(d: &Path, file: &str) {
    let dir = import_copy(d, "imp");
    std::fs::remove_file(dir.join(file)).unwrap();
    mkfifo(&dir.join(file));
}

/// A case that trains `imp.yaml` (a fine-tune of the import copy `imp/`, which `setup` makes and
/// spoils) into `new/`.
fn import_case(name: &'static str, expect: Expect, setup: fn(&Path)) -> Case {
    case(
        name,
        &["train", "imp.yaml", "--run-dir", "new", "--quiet"],
        expect,
        &["new"],
    )
    .setup(setup)
}

/// Plans a one-cell Slurm sweep of `lm.yaml` into `sweep/` (nothing trains).
fn plan_sweep(d: &Path) {
    ok(
        d,
        &[
            "ablate",
            "lm.yaml",
            "--launcher",
            "slurm",
            "--variants",
            "none",
            "--seeds",
            "1",
            "--out",
            "sweep",
        ],
    );
}

/// Trains a one-run local sweep of `lm.yaml` into `sweep/`.
fn local_sweep(d: &Path, seeds: &str) {
    ok(
        d,
        &[
            "ablate",
            "lm.yaml",
            "--variants",
            "none",
            "--seeds",
            seeds,
            "--out",
            "sweep",
            "--quiet",
        ],
    );
}

/// A length study in `study/` (scripts/length-study.sh's layout) of the fixture's run as seeds 1
/// and 2, evaluated at context 8 (both seeds) and 12 (seed 1 only), log-n off.
fn length_study(d: &Path) {
    for seed in [1, 2] {
        let name = format!("none-lr3e-3-seed{seed}");
        let run = d.join("study/sweep/runs").join(&name);
        std::fs::create_dir_all(&run).unwrap();
        let cfg = std::fs::read_to_string(d.join("run/config.yaml"))
            .unwrap()
            .replace("seed: 0", &format!("seed: {seed}"));
        std::fs::write(run.join("config.yaml"), cfg).unwrap();
        std::fs::create_dir_all(d.join("study/evals").join(&name)).unwrap();
        for context in if seed == 1 { &[8, 12][..] } else { &[8][..] } {
            let json = ok(
                d,
                &[
                    "eval",
                    "run",
                    "--context",
                    &context.to_string(),
                    "--logn",
                    "off",
                    "--json",
                ],
            );
            let file = d
                .join("study/evals")
                .join(&name)
                .join(format!("context-{context}-logn-off.json"));
            std::fs::write(file, json).unwrap();
        }
    }
}

/// Rewrites `sweep/grid.json` as ember wrote it before sweeps were relocatable: absolute paths
/// of the place it was planned in, no copy of the config.
fn grid_of_old(d: &Path) {
    let path = d.join("sweep/grid.json");
    let mut grid: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let abs = |p: &str| d.join(p).display().to_string();
    grid["config"] = abs("lm.yaml").into();
    grid["out"] = abs("sweep").into();
    grid.as_object_mut().unwrap().remove("config_source");
    for run in grid["runs"].as_array_mut().unwrap() {
        let name = run["name"].as_str().unwrap().to_string();
        run["dir"] = abs(&format!("sweep/runs/{name}")).into();
    }
    std::fs::write(&path, serde_json::to_string_pretty(&grid).unwrap()).unwrap();
    std::fs::remove_file(d.join("sweep/base.yaml")).unwrap();
}

pub(super) fn cases() -> Vec<Case> {
    use Expect::*;
    vec![
        // No command writes into a checkpoint, a model folder or the Hugging Face folder a run
        // reads, whatever the spelling; each refusal names the protected thing.
        case(
            "export over the Hugging Face folder its run starts from",
            &["export", "ft", "hf"],
            Refused(&["OUT hf", "model.init_from"]),
            &[],
        ),
        case(
            "export over it by another spelling",
            &["export", "ft", "run/../hf"],
            Refused(&["run/../hf", "model.init_from"]),
            &[],
        ),
        case(
            "export into it through a link",
            &["export", "ft", "alias/inner"],
            Refused(&["inside", "model.init_from"]),
            &[],
        )
        .setup(|d| std::os::unix::fs::symlink("hf", d.join("alias")).unwrap()),
        case(
            "export into another Hugging Face folder",
            &["export", "run", "hf"],
            Refused(&["hf", "Hugging Face model folder"]),
            &[],
        ),
        case(
            "export refused by its reference text before a byte is written",
            &[
                "export",
                "run",
                "new-hf",
                "--reference-logits",
                "logits.json",
                "--reference-text",
                "",
            ],
            Refused(&["--reference-text"]),
            &[],
        ),
        case(
            "package into a checkpoint",
            &["package", "run", "run/checkpoints/step-00000002/released"],
            Refused(&["step-00000002", "a checkpoint of the run"]),
            &[],
        ),
        case(
            "package as a checkpoint to come",
            &["package", "run", "run/checkpoints/step-00000099"],
            Refused(&["step-00000099", "checkpoints of the run"]),
            &[],
        ),
        case(
            "package into the checkpoints through a link",
            &["package", "run", "ck/released"],
            Refused(&["ck/released", "checkpoints of the run"]),
            &[],
        )
        .setup(|d| std::os::unix::fs::symlink("run/checkpoints", d.join("ck")).unwrap()),
        case(
            "package into the checkpoints by another case",
            &["package", "run", "run/Checkpoints/released"],
            Refused(&["Checkpoints", "checkpoints"]),
            &[],
        )
        // A case-insensitive disk makes `Checkpoints` the same folder; a link does here.
        .setup(|d| std::os::unix::fs::symlink("checkpoints", d.join("run/Checkpoints")).unwrap()),
        case(
            "package beside a run under a name the run keeps",
            &["package", "run", "run/CHECKPOINTS"],
            Refused(&["CHECKPOINTS", "keeps for its own files"]),
            &[],
        ),
        case(
            "package into a model folder",
            &["package", "run", "released/inner"],
            Refused(&["inside", "model folder"]),
            &[],
        )
        .setup(|d| {
            ok(d, &["package", "run", "released"]);
        }),
        case(
            "package into an empty folder",
            &["package", "run", "empty"],
            Ok(&[]),
            &["empty"],
        )
        .setup(|d| std::fs::create_dir(d.join("empty")).unwrap())
        .after(|d, _| assert!(d.join("empty/model.json").is_file())),
        case(
            "package of a model folder",
            &["package", "released", "again"],
            Refused(&["released", "model folder", "not a run"]),
            &[],
        )
        .setup(|d| {
            ok(d, &["package", "run", "released"]);
        }),
        case(
            "a model folder without its manifest",
            &["generate", "released", "--max-tokens", "2"],
            Refused(&["released", "model.json", "incomplete"]),
            &[],
        )
        .setup(|d| {
            ok(d, &["package", "run", "released"]);
            std::fs::remove_file(d.join("released/model.json")).unwrap();
        }),
        case(
            "tokenize into a checkpoint",
            &[
                "tokenize",
                "run",
                "in.txt",
                "run/checkpoints/step-00000004/ids.bin",
            ],
            Refused(&["OUTPUT", "a checkpoint of the run"]),
            &[],
        ),
        case(
            "eval --output into the checkpoints",
            &["eval", "run", "--output", "run/checkpoints/hyp.txt"],
            Refused(&["--output", "checkpoints of the run"]),
            &[],
        ),
        case(
            "a run directory in the folder it starts from",
            &["train", "ft.yaml", "--run-dir", "hf"],
            Refused(&["--run-dir", "model.init_from"]),
            &[],
        ),
        case(
            "a run directory inside a model folder",
            &["train", "lm.yaml", "--run-dir", "released/run"],
            Refused(&["--run-dir", "model folder"]),
            &[],
        )
        .setup(|d| {
            ok(d, &["package", "run", "released"]);
        }),
        case(
            "a sweep inside a run's checkpoints",
            &[
                "ablate",
                "lm.yaml",
                "--variants",
                "none",
                "--seeds",
                "1",
                "--out",
                "run/checkpoints/sweep",
            ],
            Refused(&["--out", "checkpoints of the run"]),
            &[],
        ),
        // Every file of an import folder is opened as other inputs are.
        import_case(
            "a FIFO as the import's config.json",
            Refused(&["imp/config.json", "FIFO"]),
            |d| import_with_fifo(d, "config.json"),
        ),
        import_case(
            "a FIFO as the import's tokenizer_config.json",
            Refused(&["imp/tokenizer_config.json", "FIFO"]),
            |d| import_with_fifo(d, "tokenizer_config.json"),
        ),
        import_case(
            "a FIFO as the import's weights",
            Refused(&["imp/model.safetensors", "FIFO"]),
            |d| import_with_fifo(d, "model.safetensors"),
        ),
        import_case(
            "a FIFO as a shard the index names",
            Refused(&["model-00001-of-00001.safetensors", "FIFO"]),
            |d| {
                let dir = import_copy(d, "imp");
                write_index(&dir, "model-00001-of-00001.safetensors");
                std::fs::remove_file(dir.join("model.safetensors")).unwrap();
                mkfifo(&dir.join("model-00001-of-00001.safetensors"));
            },
        ),
        import_case(
            "a device as the import's tokenizer.json",
            Refused(&["imp/tokenizer.json", "device"]),
            |d| {
                let dir = import_copy(d, "imp");
                std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
                std::os::unix::fs::symlink("/dev/zero", dir.join("tokenizer.json")).unwrap();
            },
        ),
        import_case(
            "a folder as the import's config.json",
            Refused(&["imp/config.json", "folder"]),
            |d| {
                let dir = import_copy(d, "imp");
                std::fs::remove_file(dir.join("config.json")).unwrap();
                std::fs::create_dir(dir.join("config.json")).unwrap();
            },
        ),
        // Imports are checked before training.
        import_case(
            "a NaN in an imported weight",
            Refused(&["model.norm.weight", "non-finite", "imp/model.safetensors"]),
            |d| {
                poison(
                    &import_copy(d, "imp").join("model.safetensors"),
                    "model.norm.weight",
                )
            },
        ),
        import_case(
            "a single file beside a stale index",
            Ok(&["model.safetensors.index.json", "as transformers reads it"]),
            |d| {
                let dir = import_copy(d, "imp");
                write_index(&dir, "model-00001-of-00002.safetensors");
                std::fs::write(dir.join("model-00001-of-00002.safetensors"), "stale").unwrap();
            },
        ),
        import_case(
            "a tied config beside a trained head",
            Ok(&["lm_head.weight", "tie_word_embeddings", "not used"]),
            |d| {
                let weights = import_copy(d, "imp").join("model.safetensors");
                let (header, _) = st_header(&weights);
                let shape: Vec<usize> =
                    serde_json::from_value(header["model.embed_tokens.weight"]["shape"].clone()).unwrap();
                add_tensor(&weights, "lm_head.weight", &shape, 0.5);
            },
        ),
        import_case(
            "an untied config without a head",
            Refused(&["lm_head.weight", "tie_word_embeddings"]),
            |d| {
                let config = import_copy(d, "imp").join("config.json");
                let text = std::fs::read_to_string(&config)
                    .unwrap()
                    .replace("\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false");
                std::fs::write(config, text).unwrap();
            },
        ),
        // The vector unit is part of a run's identity.
        case(
            "resuming on another vector unit",
            &[
                "train",
                "lm.yaml",
                "--run-dir",
                "run",
                "--resume",
                "--set",
                "train.steps=6",
                "--quiet",
            ],
            Ok(&["was computed with", "baseline", "bit-identical"]),
            &["run"],
        )
        .env(&[("EMBER_CPU_VECTOR_UNIT", "baseline")]),
        case(
            "extending a sweep on another vector unit",
            &[
                "ablate",
                "lm.yaml",
                "--variants",
                "none",
                "--seeds",
                "2",
                "--out",
                "sweep",
                "--quiet",
            ],
            Ok(&["warning", "sweep was computed with", "baseline"]),
            &["sweep"],
        )
        .setup(|d| local_sweep(d, "1"))
        .env(&[("EMBER_CPU_VECTOR_UNIT", "baseline")])
        .after(|d, _| {
            let md = std::fs::read_to_string(d.join("sweep/report.md")).unwrap();
            assert!(
                md.contains("more than one vector unit") && md.contains("baseline"),
                "{md}"
            );
        }),
        // A sweep starts its runs itself: not inside another launcher's job step.
        case(
            "a sweep under mpirun",
            &[
                "ablate",
                "lm.yaml",
                "--variants",
                "none",
                "--seeds",
                "1",
                "--out",
                "sweep",
            ],
            Refused(&["mpirun", "OMPI_COMM_WORLD_SIZE=2"]),
            &[],
        )
        .env(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")]),
        case(
            "a sweep under srun",
            &[
                "ablate",
                "lm.yaml",
                "--variants",
                "none",
                "--seeds",
                "1",
                "--out",
                "sweep",
            ],
            Refused(&["Slurm job step", "SLURM_STEP_ID=0"]),
            &[],
        )
        .env(&[("SLURM_STEP_ID", "0"), ("SLURM_JOB_ID", "42")]),
        case(
            "a cell under an MPI launcher",
            &["ablate", "sweep", "--cell", "0"],
            Refused(&["MPI job", "PMIX_RANK=0"]),
            &[],
        )
        .setup(plan_sweep)
        .env(&[("PMIX_RANK", "0")]),
        // Sweeps work wherever they lie.
        case(
            "--status of a moved sweep",
            &["ablate", "moved", "--status"],
            Ok(&[]),
            &[],
        )
        .setup(|d| {
            plan_sweep(d);
            std::fs::rename(d.join("sweep"), d.join("moved")).unwrap();
        }),
        case(
            "a cell of a copied sweep",
            &["ablate", "copy/sweep", "--cell", "0"],
            Ok(&[]),
            &["copy"],
        )
        .setup(|d| {
            plan_sweep(d);
            copy_dir(&d.join("sweep"), &d.join("copy/sweep"));
        })
        .after(|d, _| {
            let summary = d.join("copy/sweep/runs/none-lr3e-3-seed1/summary.json");
            assert!(summary.is_file(), "the cell trained in the copy");
        }),
        case(
            "the report of a moved sweep",
            &["report", "moved"],
            Ok(&[]),
            &["moved"],
        )
        .setup(|d| {
            local_sweep(d, "1");
            std::fs::rename(d.join("sweep"), d.join("moved")).unwrap();
        }),
        case(
            "a cell of a moved sweep planned before sweeps were relocatable",
            &["ablate", "moved", "--cell", "0"],
            Ok(&[]),
            &["moved"],
        )
        .setup(|d| {
            plan_sweep(d);
            grid_of_old(d);
            std::fs::rename(d.join("sweep"), d.join("moved")).unwrap();
        })
        .after(|d, _| assert!(d.join("moved/runs/none-lr3e-3-seed1/summary.json").is_file())),
        // From the earlier rounds.
        case(
            "log-n below the block",
            &[
                "train",
                "lm.yaml",
                "--set",
                "model.logn_attention=true",
                "--set",
                "model.logn_length=4",
                "--run-dir",
                "new",
                "--quiet",
            ],
            Ok(&["model.logn_length = 4", "below the training length"]),
            &["new"],
        ),
        case(
            "a run's config edited to another width",
            &["generate", "run", "--max-tokens", "2"],
            Refused(&["run/config.yaml", "model.d_model", "edited"]),
            &[],
        )
        .setup(|d| {
            let path = d.join("run/config.yaml");
            let text = std::fs::read_to_string(&path)
                .unwrap()
                .replace("d_model: 16", "d_model: 24");
            std::fs::write(path, text).unwrap();
        }),
        case(
            "a length study whose file name says another context",
            &["length-report", "study"],
            Refused(&["context-8-logn-off.json", "context 12"]),
            &[],
        )
        .setup(|d| {
            length_study(d);
            let evals = d.join("study/evals/none-lr3e-3-seed1");
            std::fs::remove_file(evals.join("context-8-logn-off.json")).unwrap();
            std::fs::copy(
                evals.join("context-12-logn-off.json"),
                evals.join("context-8-logn-off.json"),
            )
            .unwrap();
        }),
        case(
            "a length study missing a seed",
            &["length-report", "study"],
            Ok(&[
                "no evaluation at context 12 for seed 2",
                "context-12-logn-off.json",
            ]),
            &["study"],
        )
        .setup(length_study),
    ]
}
