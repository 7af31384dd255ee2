//! CUDA graph capture for the `graph` timing mode: everything queued on a [`Gpu`]'s stream
//! inside [`capture`] becomes one instantiated graph that [`Graph::launch`] replays.
//!
//! Uses cudarc 0.19's stream capture (`CudaStream::begin_capture` / `end_capture`, which
//! instantiate the graph; CUDA driver API `cuStreamBeginCapture`, `cuStreamEndCapture`,
//! `cuGraphInstantiate`). Capture runs in `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`, so other host
//! threads (the clock poller) are not affected. The legacy default stream cannot be captured:
//! capture on a stream from [`Gpu::on_new_stream`]. Work queued during capture must not
//! allocate or synchronize (rigbench's GEMM `run`s only launch kernels and cuBLASLt calls on
//! buffers made beforehand).

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;

use super::Gpu;

/// An instantiated graph bound to the stream it was captured on.
pub struct Graph {
    inner: CudaGraph,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Graph")
    }
}

impl Graph {
    /// Queue one replay of the whole graph on its stream.
    ///
    /// # Errors
    /// The driver refuses the launch.
    pub fn launch(&self) -> anyhow::Result<()> {
        self.inner
            .launch()
            .map_err(|e| anyhow::anyhow!("cuGraphLaunch failed: {e:?}"))
    }
}

/// Capture the work `body` queues on `gpu`'s stream into a graph, instantiate it and upload it
/// (so that the first launch carries no set-up cost). Waits for the stream first.
///
/// # Errors
/// `gpu` uses the legacy default stream (capture is not allowed there), `body` fails (capture
/// is ended and its partial graph dropped; the body's error is returned), or the driver cannot
/// capture, instantiate or upload the graph (e.g. an operation that is not capturable).
pub fn capture(gpu: &Gpu, body: &mut dyn FnMut() -> anyhow::Result<()>) -> anyhow::Result<Graph> {
    let stream = gpu.stream();
    if stream.cu_stream().is_null() {
        anyhow::bail!(
            "CUDA graph capture needs a created stream, not the legacy default stream (use Gpu::on_new_stream)"
        );
    }
    gpu.sync()?;
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(|e| anyhow::anyhow!("cuStreamBeginCapture failed: {e:?}"))?;
    let body_result = body();
    // Always end the capture, so the stream is usable again whatever happened.
    let ended = stream.end_capture(CUgraphInstantiate_flags(0));
    body_result.map_err(|e| e.context("while capturing a CUDA graph"))?;
    let inner = ended
        .map_err(|e| anyhow::anyhow!("cuStreamEndCapture / cuGraphInstantiate failed: {e:?}"))?
        .ok_or_else(|| anyhow::anyhow!("the captured CUDA graph is empty (nothing was queued)"))?;
    inner
        .upload()
        .map_err(|e| anyhow::anyhow!("cuGraphUpload failed: {e:?}"))?;
    Ok(Graph { inner })
}
