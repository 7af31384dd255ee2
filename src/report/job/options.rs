//! What a job runs: [`Job`], filled in by `rigbench report` and `rigbench kernels`.

use std::path::PathBuf;

use crate::kernels::bench::BenchOptions;
use crate::report::schema::Skip;

/// What to run.
pub struct Job {
    /// Kernel benches (run only with a GPU).
    pub kernels: Option<BenchOptions>,
    /// The CPU reference accuracy study of each format (runs everywhere).
    pub accuracy: bool,
    /// The fidelity study on trained weights (`crate::runtime_eval::quality`), run on the CPU when the
    /// SmolLM2 GGUF is in the cache folder (`scripts/fetch-smollm2.sh`); skipped with the reason
    /// otherwise.
    pub quality: bool,
    /// Checkpoint to inspect (card and memory taken from the rig probe).
    pub checkpoint: Option<PathBuf>,
    /// End-to-end runs (the engine in it: the built-in runtime, or an external one).
    pub e2e: Option<crate::e2e::E2eOptions>,
    /// The model of the GPU runtime's runs (`synthetic:qwen3-8b` by default).
    pub runtime_model: String,
    /// Where the built-in runtime runs (resolved `--runtime-device`).
    pub runtime_device: crate::runtime::backend::Device,
    /// Report folder (default `reports/<rig-label>/<timestamp>/`).
    pub out: Option<PathBuf>,
    /// Rig label override.
    pub rig_label: Option<String>,
    /// Redact host names, user paths and IPs.
    pub redact: bool,
    /// Write the report folder (false: results only returned).
    pub write_files: bool,
    /// Parts the user turned off, recorded as skipped with the flag that did it.
    pub disabled: Vec<Skip>,
    /// Repeats of the kernel suite on the first device (`--repeats R`; see
    /// [`crate::kernels::repeats`]); other devices run the suite once, alongside.
    pub repeats: usize,
    /// Replace a report already in `out` (`--force`), once this run has measured something.
    pub force: bool,
    /// GPUs to bench (`--devices`); the first one's rows are the `kernels` section, the others
    /// run at the same time and are compared with it.
    pub devices: crate::multigpu::DeviceSelection,
    /// Measure the interconnect and predict tensor-parallel decode when two or more GPUs are
    /// selected (`report`).
    pub interconnect: bool,
    /// The all-reduce model of the tensor-parallel composite predicted from the first GPU's
    /// rows at TP = 2, 4, 8 (`report`; `None`: not predicted). See
    /// [`crate::multigpu::tp_model`].
    pub tp_allreduce: Option<crate::multigpu::tp_model::AllReduceModel>,
    /// Continue the interrupted report in this folder (`report --resume`): see
    /// [`resumable`](super::resumable).
    pub resume: Option<PathBuf>,
    /// The time budget's plan this job was shaped by (`report --budget`; `None`: no budget,
    /// or a command without one), recorded in the results and said in the report.
    pub budget: Option<crate::report::schema::BudgetRecord>,
}
