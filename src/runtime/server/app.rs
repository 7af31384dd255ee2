//! The state every handler of the server shares ([`App`]: the engine handle, the limits) and
//! [`off_request_threads`], which runs a request's CPU-bound preparation off the threads that
//! answer requests.

use std::sync::Arc;

use super::error::ApiError;
use crate::runtime::engine::EngineHandle;

pub(super) struct App {
    pub(super) engine: EngineHandle,
    pub(super) created: u64,
    /// Permits for CPU-bound request work ([`off_request_threads`]): one per core.
    pub(super) cpu_work: tokio::sync::Semaphore,
    /// The most messages one chat request may have ([`ServeLimits::max_chat_messages`]).
    pub(super) max_chat_messages: usize,
    /// The most log-probability alternatives a request may ask for
    /// ([`ServeLimits::max_logprobs`], the whole vocabulary at most).
    pub(super) max_logprobs: usize,
}

pub(super) type AppState = Arc<App>;

impl App {
    pub(super) fn check_model(&self, model: &Option<String>) -> Result<(), ApiError> {
        match model {
            None => Ok(()),
            Some(m) if *m == self.engine.info.served_model_name || *m == self.engine.info.model => {
                Ok(())
            }
            Some(m) => Err(ApiError::bad(format!(
                "The model `{m}` does not exist; this server serves `{}`",
                self.engine.info.served_model_name
            ))
            .param("model")),
        }
    }

    pub(super) fn max_model_len(&self) -> usize {
        self.engine.info.capacity.max_model_len
    }
}

/// Run CPU-bound request work (parsing a body of up to [`super::MAX_BODY_BYTES`], the chat
/// template, the tokenizer) on tokio's blocking threads, at most one job per core at a time, so
/// that the threads that handle requests keep answering (`/health`, streams in flight) while a
/// large request is prepared.
///
/// # Errors
/// `f`'s error; a 500 when the job panicked or the server is shutting down.
pub(super) async fn off_request_threads<T, F>(app: &AppState, f: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(&App) -> Result<T, ApiError> + Send + 'static,
{
    let _permit = app
        .cpu_work
        .acquire()
        .await
        .map_err(|_| ApiError::internal("the server is shutting down"))?;
    let app = Arc::clone(app);
    tokio::task::spawn_blocking(move || f(&app))
        .await
        .map_err(|e| ApiError::internal(format!("request preparation failed: {e}")))?
}
