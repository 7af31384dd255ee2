//! The handle to the engine thread (submit, abort, reset the prefix cache, shut down) and
//! [`spawn`], which starts the thread.

use super::*;

/// A handle to the engine thread (cheap to clone).
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Command>,
    next_id: Arc<AtomicU64>,
    /// Metrics the engine updates.
    pub metrics: Arc<Metrics>,
    /// Facts about the engine.
    pub info: Arc<EngineInfo>,
    /// The tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template.
    pub template: Arc<ChatTemplate>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("info", &self.info)
            .finish()
    }
}

impl EngineHandle {
    /// Submit a request; returns its id and the receiver of its outputs.
    ///
    /// # Errors
    /// When the engine thread has stopped.
    pub fn submit(
        &self,
        req: GenerateRequest,
    ) -> anyhow::Result<(u64, tmpsc::UnboundedReceiver<RequestOutput>)> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tmpsc::unbounded_channel();
        self.tx
            .send(Command::Add(id, Box::new(req), tx))
            .map_err(|_| anyhow::anyhow!("the engine has stopped"))?;
        Ok((id, rx))
    }

    /// Abort a request (a no-op if it already finished).
    pub fn abort(&self, id: u64) {
        let _ = self.tx.send(Command::Abort(id));
    }

    /// Forget all cached prefixes; resolves once done.
    ///
    /// # Errors
    /// When the engine thread has stopped.
    pub async fn reset_prefix_cache(&self) -> anyhow::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::ResetPrefixCache(tx))
            .map_err(|_| anyhow::anyhow!("the engine has stopped"))?;
        rx.await
            .map_err(|_| anyhow::anyhow!("the engine has stopped"))
    }

    /// Ask the engine thread to stop.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
    }
}

/// Start the engine thread.
///
/// # Errors
/// When the thread cannot be spawned.
pub fn spawn(loaded: Loaded) -> anyhow::Result<(EngineHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel();
    let Loaded {
        engine,
        info,
        tokenizer,
        template,
        metrics,
    } = loaded;
    let join = std::thread::Builder::new()
        .name("rigbench-engine".into())
        .spawn(move || engine.run(rx))?;
    Ok((
        EngineHandle {
            tx,
            next_id: Arc::new(AtomicU64::new(1)),
            metrics,
            info: Arc::new(info),
            tokenizer,
            template,
        },
        join,
    ))
}
