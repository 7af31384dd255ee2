//! The server's error answer: OpenAI's error body `{"error": {"message", "type", "param",
//! "code"}}` with its HTTP status ([`ApiError`]), and the 404 of an unknown endpoint.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

/// An OpenAI-style error response.
#[derive(Debug)]
pub(super) struct ApiError {
    status: StatusCode,
    message: String,
    param: Option<&'static str>,
}

impl ApiError {
    pub(super) fn bad(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: None,
        }
    }

    pub(super) fn param(mut self, p: &'static str) -> Self {
        self.param = Some(p);
        self
    }

    pub(super) fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            param: None,
        }
    }

    pub(super) fn body(&self) -> Value {
        let kind = match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::NOT_FOUND => "NotFoundError",
            _ => "InternalServerError",
        };
        json!({"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status.as_u16()}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

pub(super) async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: "no such endpoint".into(),
        param: None,
    }
}
