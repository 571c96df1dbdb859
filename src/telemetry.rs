//! OTLP export of Keel's `tracing` spans, and the trace context the provider client sends.
//!
//! Owns [`Otlp`] (where to export, from the standard OpenTelemetry variables `main` reads),
//! the exporter behind it (OTLP over HTTP with protobuf bodies, batched on the SDK's own
//! thread through a bounded queue), [`Flush`] (the bounded flush at exit) and
//! [`current_trace`] (the calling span's W3C context, for `traceparent`).
//!
//! It must never block or fail an effect: a finished span is handed to a queue of
//! `engine::limits::OTLP_QUEUE_SPANS_MAX` spans and dropped when it is full; one export takes at
//! most `OTLP_EXPORT_TIMEOUT_MS` on the exporter's thread; the flush at exit waits at most
//! `OTLP_SHUTDOWN_MS`. A collector that is dead, slow or refuses the export costs the spans,
//! nothing else. It reads no variable itself: `main` passes the endpoint and service name it
//! read, and Keel's bounds are set explicitly, over the OpenTelemetry SDK's own variables (the
//! SDK still reads those Keel does not set, such as `OTEL_EXPORTER_OTLP_HEADERS` for a
//! collector that wants credentials, or `OTEL_TRACES_SAMPLER`). It adds no attribute but the
//! resource's `service.name` and `service.version`: what is exported is what the spans carry,
//! and they carry no argument, token or key.

use adapters::transport::TraceContext;
use engine::limits;
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider};
use std::time::Duration;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The path of the traces signal under a base OTLP/HTTP endpoint.
const TRACES_PATH: &str = "v1/traces";

/// The service name when `OTEL_SERVICE_NAME` is unset or empty.
const DEFAULT_SERVICE_NAME: &str = "keel";

/// Where spans are exported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Otlp {
    /// The traces URL the export requests are posted to.
    pub traces_url: String,
    /// The `service.name` of the exported resource.
    pub service_name: String,
}

impl Otlp {
    /// Export settings from the standard variables' values: `traces_endpoint`
    /// (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, the traces URL as it is) wins over `endpoint`
    /// (`OTEL_EXPORTER_OTLP_ENDPOINT`, a base URL `v1/traces` is appended to); `service_name`
    /// is `OTEL_SERVICE_NAME`. `None`, exporting nothing, when neither endpoint is set or both
    /// are empty.
    pub fn from_vars(
        traces_endpoint: Option<String>,
        endpoint: Option<String>,
        service_name: Option<String>,
    ) -> Option<Self> {
        let set = |value: Option<String>| value.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let traces_url = set(traces_endpoint)
            .or_else(|| set(endpoint).map(|base| format!("{}/{TRACES_PATH}", base.trim_end_matches('/'))))?;
        let service_name = set(service_name).unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned());
        Some(Self { traces_url, service_name })
    }

    /// The tracer whose spans go to this endpoint, and the flush its process owes at exit.
    ///
    /// # Errors
    ///
    /// The exporter's refusal of the settings (a URL that does not parse): the caller logs it
    /// and runs without export.
    pub fn start(&self) -> Result<(SdkTracer, Flush), opentelemetry_otlp::ExporterBuildError> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(&self.traces_url)
            .with_timeout(Duration::from_millis(limits::OTLP_EXPORT_TIMEOUT_MS))
            .build()?;
        let batches = BatchConfigBuilder::default()
            .with_max_queue_size(limits::OTLP_QUEUE_SPANS_MAX)
            .with_max_export_batch_size(limits::OTLP_BATCH_SPANS_MAX)
            .with_scheduled_delay(Duration::from_millis(limits::OTLP_EXPORT_DELAY_MS))
            .build();
        let processor = BatchSpanProcessor::builder(exporter).with_batch_config(batches).build();
        let resource = opentelemetry_sdk::Resource::builder_empty()
            .with_service_name(self.service_name.clone())
            .with_attribute(opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider = SdkTracerProvider::builder().with_span_processor(processor).with_resource(resource).build();
        let tracer = provider.tracer("keel");
        Ok((tracer, Flush(Some(provider))))
    }
}

/// The spans a process still owes its collector, sent when it is dropped (at the end of
/// `main`), within `OTLP_SHUTDOWN_MS`: past that the process exits without them.
#[must_use = "dropping it at once would stop the export before any span ends"]
pub struct Flush(Option<SdkTracerProvider>);

impl Flush {
    /// Nothing to flush: the export is off.
    pub fn none() -> Self {
        Self(None)
    }
}

impl Drop for Flush {
    fn drop(&mut self) {
        if let Some(provider) = self.0.take() {
            // A timeout or a failed export is a loss of spans, which the collector's absence
            // already announced; the command's outcome stands either way.
            let _ = provider.shutdown_with_timeout(Duration::from_millis(limits::OTLP_SHUTDOWN_MS));
        }
    }
}

/// The W3C trace context of the current span: what the provider client sends as
/// `traceparent`. `None` when the export is off (no span has an OpenTelemetry context) or the
/// current span is none.
pub fn current_trace() -> Option<TraceContext> {
    let context = tracing::Span::current().context();
    let span = context.span();
    let span = span.span_context();
    TraceContext::new(span.trace_id().to_bytes(), span.span_id().to_bytes(), span.is_sampled())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn some(value: &str) -> Option<String> {
        Some(value.to_owned())
    }

    #[test]
    fn the_traces_endpoint_wins_and_a_base_endpoint_gets_the_traces_path() {
        let otlp = Otlp::from_vars(some("http://c:4318/custom"), some("http://other:4318"), None);
        assert_eq!(otlp.map(|o| o.traces_url), some("http://c:4318/custom"), "the traces URL is used as it is");
        for base in ["http://c:4318", "http://c:4318/"] {
            let otlp = Otlp::from_vars(None, some(base), some("checkout"));
            let expected = Otlp { traces_url: "http://c:4318/v1/traces".into(), service_name: "checkout".into() };
            assert_eq!(otlp, Some(expected), "{base}");
        }
    }

    #[test]
    fn no_endpoint_exports_nothing_and_the_service_is_keel_by_default() {
        assert_eq!(Otlp::from_vars(None, None, some("checkout")), None);
        assert_eq!(Otlp::from_vars(some(" "), some(""), None), None, "empty variables are unset");
        let otlp = Otlp::from_vars(None, some("http://c:4318"), some(""));
        assert_eq!(otlp.map(|o| o.service_name), some("keel"));
    }

    #[test]
    fn outside_any_exported_span_there_is_no_trace_context() {
        assert_eq!(current_trace(), None);
    }
}
