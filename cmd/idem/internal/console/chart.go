package console

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idemhq/idem/cmd/idem/internal/metrics"
)

// The chart's series colours, in metrics.RateKind order (also in the CSS
// legend).
var seriesColours = []string{"#2f6fdb", "#2a9d55", "#d98a00", "#c2410c", "#b91c1c"}

// ratesSVG draws the process's outcome history as a line chart: one line
// per series, in events per second over each bucket.
func (c *Console) ratesSVG(w http.ResponseWriter, r *http.Request, s session) {
	if c.cfg.Rates == nil {
		c.fail(w, r, s, http.StatusNotFound, fmt.Errorf("rates exist only inside idem serve and idem proxy"))
		return
	}
	if _, err := query(r, "t"); err != nil {
		c.fail(w, r, s, http.StatusBadRequest, err)
		return
	}
	w.Header().Set("Content-Type", "image/svg+xml")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte(drawRates(c.cfg.Rates(c.cfg.NowFunc()))))
}

// drawRates renders samples (oldest first) as an SVG document.
func drawRates(samples []metrics.RateSample) string {
	const width, height, left, bottom, top = 720.0, 200.0, 44.0, 22.0, 10.0
	per := metrics.RateBucket.Seconds()
	peak := 1.0
	for _, s := range samples {
		for _, n := range s.Counts {
			peak = max(peak, float64(n)/per)
		}
	}
	peak = niceCeil(peak)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`, width, height, width, height)
	fmt.Fprintf(&b, `<title>Outcomes per second over the last %v</title>`, metrics.RateWindow)
	plotW, plotH := width-left-8, height-bottom-top
	for i := 0; i <= 4; i++ {
		y := top + plotH*float64(i)/4
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/>`, left, y, width-8, y)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end" fill="#555">%s</text>`, left-4, y+4, trimFloat(peak*float64(4-i)/4))
	}
	n := len(samples)
	if n > 1 {
		for k := range len(seriesColours) {
			var pts []string
			for i, s := range samples {
				x := left + plotW*float64(i)/float64(n-1)
				y := top + plotH - plotH*(float64(s.Counts[k])/per)/peak
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.6" points="%s"><title>%s</title></polyline>`,
				seriesColours[k], strings.Join(pts, " "), escapeHTML(metrics.RateNames[k]))
		}
		perMin := int(time.Minute / metrics.RateBucket)
		for m := n - 1; m >= 0; m -= 5 * perMin {
			x := left + plotW*float64(m)/float64(n-1)
			label := "now"
			if ago := (n - 1 - m) / perMin; ago > 0 {
				label = fmt.Sprintf("−%d min", ago)
			}
			fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle" fill="#555">%s</text>`, x, height-6, label)
		}
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// niceCeil rounds a chart's peak up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := 1.0
	for p*10 <= v {
		p *= 10
	}
	for p > v*10 {
		p /= 10
	}
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s + "/s"
}
