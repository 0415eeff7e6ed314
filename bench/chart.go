package main

import (
	"fmt"
	"image/color"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// chartConcurrency picks the concurrency the chart shows: 32 workers if it
// was measured, else the highest measured.
func chartConcurrency(concs []int) int {
	if slices.Contains(concs, 32) {
		return 32
	}
	return slices.Max(concs)
}

// writeChart draws, for each request path, every system's throughput as a
// fraction of its baseline's in the same rounds (bare net/http; Fiber's
// own bare handler for Fiber's middleware).
func writeChart(path string, r *report) error {
	conc := chartConcurrency(r.o.Concurrency)
	paths := []string{}
	for _, p := range pathOrder {
		if len(r.systemsOf(p)) > 0 {
			paths = append(paths, p)
		}
	}
	systems := []string{sysMem, sysSQLite, sysPG, sysRedis, sysFiberIdem}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Throughput relative to the bare handler (%d workers, median of per-round ratios)", conc)
	p.Y.Label.Text = "throughput ÷ bare"
	p.Y.Min = 0
	palette := []color.Color{
		color.RGBA{31, 119, 180, 255}, color.RGBA{44, 160, 44, 255}, color.RGBA{214, 39, 40, 255},
		color.RGBA{148, 103, 189, 255}, color.RGBA{152, 223, 138, 255}, color.RGBA{255, 152, 150, 255},
		color.RGBA{197, 176, 213, 255}, color.RGBA{255, 127, 14, 255},
	}
	var shown []string
	for _, sys := range systems {
		for _, pth := range paths {
			if _, ok := r.ratio(pth, sys, baseline(sys), conc); ok {
				shown = append(shown, sys)
				break
			}
		}
	}
	w := vg.Points(9)
	maxY := 1.0
	for i, sys := range shown {
		vals := make(plotter.Values, len(paths))
		for j, pth := range paths {
			if q, ok := r.ratio(pth, sys, baseline(sys), conc); ok {
				vals[j] = q
				maxY = max(maxY, q)
			}
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.LineStyle.Width = 0
		bars.Color = palette[i%len(palette)]
		bars.Offset = w * vg.Length(float64(i)-float64(len(shown)-1)/2)
		p.Add(bars)
		label := sys
		if b := baseline(sys); b != sysBare {
			label += " (÷ " + b + ")"
		}
		p.Legend.Add(label, bars)
	}
	ref := plotter.NewFunction(func(float64) float64 { return 1 })
	ref.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
	ref.Color = color.Gray{120}
	p.Add(ref)
	p.Y.Max = maxY * 1.1
	p.NominalX(slices.Clone(paths)...)
	p.Legend.Top = true
	p.Legend.Left = false
	p.Legend.Padding = vg.Points(2)
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	p.Legend.XOffs = 0
	p.Legend.YOffs = 0
	p.Title.TextStyle.Font.Size = vg.Points(10)
	return p.Save(11*vg.Inch, 5*vg.Inch, path)
}
