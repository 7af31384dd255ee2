//! CUDA graph capture for the `graph` timing mode: everything queued on a [`Gpu`]'s stream
//! inside [`capture`] becomes one instantiated [`Graph`] that [`Graph::launch`] replays.
//!
//! A closure wrapper over [`Gpu::begin_capture`] / [`Gpu::end_capture`] (cudarc 0.19's stream
//! capture: `cuStreamBeginCapture` in thread-local mode, `cuStreamEndCapture`,
//! `cuGraphInstantiate`) that always ends the capture, whatever the body does, so the stream is
//! usable afterwards. The legacy default stream cannot be captured: capture on a stream from
//! [`Gpu::on_new_stream`] (or a `Gpu` opened with its own stream). Work queued during capture
//! must not allocate or synchronize (rigbench's GEMM `run_on_copy`s only launch kernels and
//! cuBLASLt calls on buffers made beforehand).

use super::{Gpu, Graph};

/// Capture the work `body` queues on `gpu`'s stream into a graph and instantiate it. Waits for
/// the stream first.
///
/// # Errors
/// `gpu` uses the legacy default stream (capture is not allowed there), `body` fails (the
/// capture is ended, its partial graph dropped, and the body's error returned), or the driver
/// cannot capture or instantiate the graph (e.g. an operation that is not capturable).
pub fn capture(gpu: &Gpu, body: &mut dyn FnMut() -> anyhow::Result<()>) -> anyhow::Result<Graph> {
    if gpu.stream().cu_stream().is_null() {
        anyhow::bail!(
            "CUDA graph capture needs a created stream, not the legacy default stream (use Gpu::on_new_stream)"
        );
    }
    gpu.sync()?;
    gpu.begin_capture()?;
    let body_result = body();
    // Always end the capture, so the stream is usable again whatever happened.
    let ended = gpu.end_capture();
    body_result.map_err(|e| e.context("while capturing a CUDA graph"))?;
    Ok(ended?)
}
