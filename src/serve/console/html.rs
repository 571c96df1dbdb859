//! The console's markup: a builder that escapes every text, the page shell, small SVG charts.
//!
//! Owns [`Html`], whose only doors are [`Html::tag`] (markup, a `&'static str` written in this
//! source) and [`Html::text`] (anything else, HTML-escaped): a ticket, a reason, an order id or
//! a key name can only ever become text, never markup. The page shell and the stylesheet are
//! embedded in the binary (`include_str!`); nothing is fetched from elsewhere. It never reads
//! the log and never decides what a page shows.

use std::fmt::Write as _;

/// The page shell: `{title}`, `{nav}` and `{body}` are replaced, once each, in that order.
const SHELL: &str = include_str!("page.html");

/// The stylesheet, served at `/console/console.css`.
pub const STYLESHEET: &str = include_str!("console.css");

/// `text` with `&`, `<`, `>`, `"` and `'` escaped: safe in an element and in a quoted attribute.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            other => out.push(other),
        }
    }
    out
}

/// `text` as one path segment: every byte but unreserved characters and `:` percent-encoded
/// (an intent id may hold `/`, `?`, `#` or `%`).
pub fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~' | b':') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// Markup under construction.
#[derive(Default)]
pub struct Html(String);

impl Html {
    /// Empty markup.
    pub fn new() -> Self {
        Self::default()
    }

    /// Markup written in this source.
    pub fn tag(&mut self, markup: &'static str) -> &mut Self {
        self.0.push_str(markup);
        self
    }

    /// Any text, escaped.
    pub fn text(&mut self, text: &str) -> &mut Self {
        self.0.push_str(&escape(text));
        self
    }

    /// Markup built elsewhere (itself only ever built through these doors).
    pub fn append(&mut self, other: Html) -> &mut Self {
        self.0.push_str(&other.0);
        self
    }

    /// `<tag>text</tag>`, for a literal tag pair.
    pub fn element(&mut self, open: &'static str, text: &str, close: &'static str) -> &mut Self {
        self.tag(open).text(text).tag(close)
    }

    /// A link to `path` (its dynamic parts already [`segment`]-encoded) showing `text`.
    pub fn link(&mut self, path: &str, text: &str) -> &mut Self {
        self.tag("<a href=\"").text(path).tag("\">").text(text).tag("</a>")
    }

    /// A form's hidden CSRF field.
    pub fn csrf(&mut self, token: &str) -> &mut Self {
        self.tag("<input type=\"hidden\" name=\"csrf\" value=\"").text(token).tag("\">")
    }
}

/// A whole page: the shell with its title, navigation (`signed_in`: the key's name and role,
/// and the logout form's token) and body.
pub fn page(title: &str, signed_in: Option<(&str, &str, &str)>, body: Html) -> String {
    let mut nav = Html::new();
    if let Some((name, role, csrf)) = signed_in {
        nav.tag("<a href=\"/console/intents\">Intents</a> <a href=\"/console/runs\">Runs</a> ")
            .tag("<a href=\"/console/metrics\">Metrics</a> <span class=\"who\">")
            .text(name)
            .tag(" (")
            .text(role)
            .tag(")</span> <form method=\"post\" action=\"/console/logout\" class=\"inline\">")
            .csrf(csrf)
            .tag("<button type=\"submit\">Log out</button></form>");
    }
    let (before_title, rest) = SHELL.split_once("{title}").unwrap_or((SHELL, ""));
    let (before_nav, rest) = rest.split_once("{nav}").unwrap_or((rest, ""));
    let (before_body, after_body) = rest.split_once("{body}").unwrap_or((rest, ""));
    let mut out = String::with_capacity(SHELL.len() + body.0.len() + nav.0.len());
    out.push_str(before_title);
    out.push_str(&escape(title));
    out.push_str(before_nav);
    out.push_str(&nav.0);
    out.push_str(before_body);
    out.push_str(&body.0);
    out.push_str(after_body);
    out
}

/// A horizontal bar chart, server-rendered SVG: one bar per `(label, value)`, scaled to the
/// largest value (or to `max` when given: rates are drawn against 1).
pub fn bar_chart(title: &str, bars: &[(String, f64)], max: Option<f64>, unit: &str) -> Html {
    const WIDTH: f64 = 420.0;
    const LABEL: f64 = 170.0;
    const ROW: f64 = 22.0;
    let top = max.unwrap_or_else(|| bars.iter().map(|(_, v)| *v).fold(0.0, f64::max)).max(f64::MIN_POSITIVE);
    #[allow(clippy::cast_precision_loss, reason = "a handful of bars")]
    let height = ROW * bars.len() as f64 + 26.0;
    let mut svg = Html::new();
    svg.tag("<figure class=\"chart\"><figcaption>").text(title).tag("</figcaption>");
    svg.tag("<svg xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" width=\"")
        .text(&format!("{}", WIDTH + LABEL + 90.0))
        .tag("\" height=\"")
        .text(&format!("{height}"))
        .tag("\">");
    for (row, (label, value)) in bars.iter().enumerate() {
        #[allow(clippy::cast_precision_loss, reason = "a handful of bars")]
        let y = ROW * row as f64 + 4.0;
        let length = (value / top).clamp(0.0, 1.0) * WIDTH;
        svg.tag("<text x=\"0\" y=\"")
            .text(&format!("{}", y + 14.0))
            .tag("\">")
            .text(label)
            .tag("</text><rect class=\"bar\" x=\"")
            .text(&format!("{LABEL}"))
            .tag("\" y=\"")
            .text(&format!("{y}"))
            .tag("\" height=\"16\" width=\"")
            .text(&format!("{length:.1}"))
            .tag("\"></rect><text x=\"")
            .text(&format!("{:.1}", LABEL + length + 6.0))
            .tag("\" y=\"")
            .text(&format!("{}", y + 14.0))
            .tag("\">")
            .text(&format!("{}{unit}", trim(*value)))
            .tag("</text>");
    }
    svg.tag("</svg></figure>");
    svg
}

/// A figure as a chart labels it: an integer without decimals, else two.
fn trim(value: f64) -> String {
    if value.fract() == 0.0 { format!("{value:.0}") } else { format!("{value:.2}") }
}

#[cfg(test)]
mod tests {
    use super::{Html, bar_chart, escape, page, segment};

    #[test]
    fn every_text_is_escaped_and_only_literal_markup_is_not() {
        let hostile = "<script>alert('x')</script> & \"quoted\"";
        assert_eq!(escape(hostile), "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;quoted&quot;");
        let mut body = Html::new();
        body.element("<p>", hostile, "</p>").link("/console/intents/a", hostile).csrf("\"><script>");
        let page = page(hostile, Some((hostile, "operator", "t")), body);
        assert!(!page.contains("<script>"), "{page}");
        assert!(page.contains("&lt;script&gt;alert"), "{page}");
        let chart = bar_chart(hostile, &[(hostile.to_owned(), 1.0)], None, "").0;
        assert!(!chart.contains("<script>"), "{chart}");
    }

    #[test]
    fn a_path_segment_keeps_a_key_s_colons_and_encodes_the_rest() {
        assert_eq!(segment("charge:7c9e:id/1?x#y%"), "charge:7c9e:id%2F1%3Fx%23y%25");
    }
}
