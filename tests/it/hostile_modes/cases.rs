//! The 48 modes: what the mock does for each and what rigbench must make of it.

/// What rigbench must make of a mode.
#[derive(Clone, Copy, Debug)]
pub(super) enum Expect {
    /// Every request succeeds with `OUTPUT_TOKENS` tokens, and no flag or validity reason calls
    /// the (complete) outputs failed, empty, truncated or degenerate.
    Works,
    /// Every request is recorded failed, its reason (lowercased) holding the needle.
    Fails(&'static str),
}

/// The body of an HTTP error answer.
#[derive(Clone, Copy, Debug)]
pub(super) enum ErrBody {
    /// OpenAI's `{"error": {"message", "type", "code"}}` with this message.
    OpenAi(&'static str),
    /// FastAPI's validation error, `{"detail": [{"loc", "msg", "type"}]}`.
    FastApiDetail,
    /// Plain text (not JSON).
    Text(&'static str),
    /// An HTML page, as a proxy in front of the engine writes it.
    Html,
    /// No body at all.
    Empty,
}

/// What the mock does with a streamed generation request.
#[derive(Clone, Copy, Debug)]
pub(super) enum Mode {
    /// An HTTP error status with a body.
    Status(u16, ErrBody),
    /// 500 with `Content-Length` 1 GiB of text, written until the client goes away.
    HugeErrorBody,
    /// 200 with `application/json` holding an OpenAI error object, no stream.
    JsonError200,
    /// A data line that is not JSON after the first token.
    DataNotJson,
    /// Chunks without `choices` (the text at top level), usage, `[DONE]`.
    NoChoices,
    /// `choices` an object, not an array.
    ChoicesNotArray,
    /// Every chunk with `choices: []`, usage claiming the tokens, `[DONE]`.
    ChoicesEmpty,
    /// `delta.content` a number.
    ContentWrongType,
    /// `event: error` with an error object after two tokens, then the end of the body.
    ErrorMidStream,
    /// The whole answer without `[DONE]`, then the end of the body.
    NoDoneThenClose,
    /// `[DONE]` and another chunk after it in the same write.
    DataAfterDone,
    /// Only the role chunk, then the end of the body.
    RoleChunkThenClose,
    /// 200, `text/event-stream`, `Content-Length: 0`.
    Empty200,
    /// `: keep-alive` comments every 200 ms until the client goes away.
    CommentsUntilTimeout,
    /// 200 with `text/html`.
    HtmlContentType,
    /// The whole stream with `\r\n` line ends (legal SSE).
    CrlfLineEnds,
    /// The whole stream one byte per write and per HTTP chunk (legal).
    OneByteWrites,
    /// One chunk's data line is 2 MB long (a padding field; under rigbench's 16 MiB bound).
    Line2Mb,
    /// Bytes 0xFF 0xFE inside a chunk's content.
    InvalidUtf8,
    /// A raw NUL byte inside a chunk's content string.
    NulByte,
    /// `usage.completion_tokens` = this JSON text (raw, so `NaN` can be sent).
    Usage(&'static str),
    /// `finish_reason: "banana"`.
    FinishReasonUnknown,
    /// The single choice carries `index: 3`.
    ChoiceIndexNonZero,
    /// The connection reset (SO_LINGER 0) before any byte of an answer.
    ResetBeforeStatus,
    /// A status line and one header, then nothing.
    HeadersNeverFinished,
    /// Nothing at all until the client goes away.
    StallBeforeFirstByte,
    /// Headers, the role chunk and one token, then nothing.
    StallAfterFirstToken,
    /// The whole stream in 16-byte pieces over about 0.7 s (under the 2 s timeout).
    SlowDrip,
    /// `Content-Length: 100000`, three chunks, then the connection closed.
    ContentLengthShort,
    /// One valid HTTP chunk, then a chunk-size line that is not hex.
    BadChunked,
    /// `HTTP/1.0 200` without a length, the whole stream, then the close (legal framing).
    Http10NoLength,
    /// 307 to the same path, for ever.
    RedirectToSelf,
}

pub(super) struct Case {
    pub(super) name: &'static str,
    pub(super) mode: Mode,
    pub(super) expect: Expect,
}

pub(super) const fn case(name: &'static str, mode: Mode, expect: Expect) -> Case {
    Case { name, mode, expect }
}

use ErrBody::*;
use Expect::*;
use Mode::*;

/// The 48 modes.
pub(super) const CASES: &[Case] = &[
    // HTTP statuses on the generation route, with and without a JSON error body.
    case(
        "http_400_openai_json",
        Status(400, OpenAi("max_tokens is too large for this model")),
        Fails("http 400 bad request: max_tokens is too large for this model"),
    ),
    case(
        "http_401_plain_text",
        Status(401, Text("Unauthorized")),
        Fails("http 401 unauthorized: unauthorized (the engine wants an api key"),
    ),
    case(
        "http_403_openai_json",
        Status(403, OpenAi("key lacks the scope generate")),
        Fails("http 403 forbidden: key lacks the scope generate (the engine wants an api key"),
    ),
    case(
        "http_404_plain_text",
        Status(404, Text("Not Found")),
        Fails("http 404 not found: not found"),
    ),
    case(
        "http_408_openai_json",
        Status(408, OpenAi("request queued too long")),
        Fails("http 408 request timeout: request queued too long"),
    ),
    case(
        "http_413_plain_text",
        Status(413, Text("Request Entity Too Large")),
        Fails("http 413 payload too large: request entity too large"),
    ),
    case(
        "http_422_fastapi_detail_json",
        Status(422, FastApiDetail),
        Fails("http 422 unprocessable entity: {\"detail\""),
    ),
    case(
        "http_429_plain_text",
        Status(429, Text("rate limited, retry later")),
        Fails("http 429 too many requests: rate limited"),
    ),
    case(
        "http_500_openai_json",
        Status(500, OpenAi("CUDA error: an illegal memory access")),
        Fails("http 500 internal server error: cuda error: an illegal memory access"),
    ),
    case(
        "http_500_empty_body",
        Status(500, Empty),
        Fails("http 500 internal server error"),
    ),
    case(
        "http_502_html_body",
        Status(502, Html),
        Fails("http 502 bad gateway: <html>"),
    ),
    case(
        "http_503_openai_json",
        Status(503, OpenAi("engine is loading the model")),
        Fails("http 503 service unavailable: engine is loading the model"),
    ),
    case(
        "http_504_empty_body",
        Status(504, Empty),
        Fails("http 504 gateway timeout: (the engine sent no body)"),
    ),
    case(
        "http_500_1gib_body",
        HugeErrorBody,
        Fails("http 500 internal server error: xxxx"),
    ),
    // Answers that are not the stream asked for.
    case(
        "json_error_object_with_200",
        JsonError200,
        Fails("expected a stream (text/event-stream), got content type 'application/json'"),
    ),
    case(
        "content_type_text_html",
        HtmlContentType,
        Fails("got content type 'text/html"),
    ),
    case(
        "empty_200_body",
        Empty200,
        Fails("stream ended before [done] after 0 chunks"),
    ),
    // SSE and chunk faults.
    case("sse_data_not_json", DataNotJson, Fails("malformed sse data (not json")),
    case("chunk_without_choices", NoChoices, Fails("but no chunk carried a choice")),
    case(
        "choices_not_an_array",
        ChoicesNotArray,
        Fails("`choices` is not an array"),
    ),
    case("choices_always_empty", ChoicesEmpty, Fails("but no chunk carried a choice")),
    case("delta_content_a_number", ContentWrongType, Fails("`choices[0].delta.content` is a number, not a string")),
    case(
        "error_event_mid_stream",
        ErrorMidStream,
        Fails("engine error in stream: cuda out of memory"),
    ),
    case(
        "no_done_then_close",
        NoDoneThenClose,
        Fails("stream ended before [done]"),
    ),
    case("data_after_done", DataAfterDone, Fails("data after [done]")),
    case(
        "role_chunk_then_close",
        RoleChunkThenClose,
        Fails("stream ended before [done] after 1 chunks"),
    ),
    case(
        "keepalive_comments_until_timeout",
        CommentsUntilTimeout,
        Fails("timed out after 2 s: http 200 headers arrived, then no sse data"),
    ),
    case("crlf_line_endings", CrlfLineEnds, Works),
    case("event_split_into_one_byte_writes", OneByteWrites, Works),
    case("single_2mb_line", Line2Mb, Works),
    case("invalid_utf8_in_content", InvalidUtf8, Fails("not utf-8")),
    case("nul_byte_in_content", NulByte, Fails("malformed sse data (not json")),
    case(
        "usage_completion_tokens_above_max",
        Usage("7"),
        Fails("impossible token count: the engine reported usage.completion_tokens = 7 for max_tokens 6"),
    ),
    case(
        "usage_completion_tokens_negative",
        Usage("-6"),
        Fails("usage.completion_tokens = "),
    ),
    case(
        "usage_completion_tokens_nan",
        Usage("NaN"),
        Fails("malformed sse data (not json"),
    ),
    case(
        "usage_completion_tokens_string",
        Usage("\"6\""),
        Fails("usage.completion_tokens = "),
    ),
    case(
        "usage_completion_tokens_u64_max",
        Usage("18446744073709551615"),
        Fails("usage.completion_tokens = 18446744073709551615 for max_tokens 6"),
    ),
    case("finish_reason_unknown", FinishReasonUnknown, Works),
    case("choice_index_not_zero", ChoiceIndexNonZero, Works),
    // Transport faults.
    case(
        "reset_before_status_line",
        ResetBeforeStatus,
        Fails("connection reset by peer"),
    ),
    case(
        "headers_never_finished",
        HeadersNeverFinished,
        Fails("timed out after 2 s: no response (status line and headers) had arrived"),
    ),
    case(
        "stall_before_first_byte",
        StallBeforeFirstByte,
        Fails("timed out after 2 s: no response (status line and headers) had arrived"),
    ),
    case(
        "stall_after_first_token",
        StallAfterFirstToken,
        Fails("timed out after 2 s: 2 chunks had arrived, 1 token-bearing"),
    ),
    case("slow_drip_under_timeout", SlowDrip, Works),
    case(
        "content_length_longer_than_body",
        ContentLengthShort,
        Fails("stream broke after"),
    ),
    case("invalid_chunked_encoding", BadChunked, Fails("stream broke after")),
    case("http_1_0_without_length", Http10NoLength, Works),
    case(
        "redirect_to_itself",
        RedirectToSelf,
        Fails("the engine's redirects: error following redirect"),
    ),
];
