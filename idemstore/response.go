package idemstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// responseEncodingV1 is the first byte of every encoded response.
const responseEncodingV1 = 1

// errBadResponseEncoding reports stored bytes that are not an encoded
// Response.
var errBadResponseEncoding = errors.New("idem: malformed stored response")

// MarshalBinary encodes the response in a compact, versioned binary form
// that stores may keep in a single BLOB or string value. Header names are
// written in sorted order, so equal responses encode to equal bytes. The
// result is allocated at its exact size, with one walk of the header.
func (r *Response) MarshalBinary() ([]byte, error) {
	if err := r.checkStatus(); err != nil {
		return nil, err
	}
	var buf [16]headerField
	fields := r.sortedFields(buf[:0])
	return r.appendFields(make([]byte, 0, r.encodedSize(fields)), fields), nil
}

// AppendBinary appends the encoding of MarshalBinary to b.
func (r *Response) AppendBinary(b []byte) ([]byte, error) {
	if err := r.checkStatus(); err != nil {
		return nil, err
	}
	var buf [16]headerField
	return r.appendFields(b, r.sortedFields(buf[:0])), nil
}

func (r *Response) checkStatus() error {
	if r.StatusCode < 100 || r.StatusCode > 999 {
		return fmt.Errorf("idem: cannot encode status code %d", r.StatusCode)
	}
	return nil
}

// headerField is one field of a header being encoded.
type headerField struct {
	name   string
	values []string
}

// sortedFields appends the header's fields to buf, sorted by name.
func (r *Response) sortedFields(buf []headerField) []headerField {
	for name, vs := range r.Header {
		buf = append(buf, headerField{name, vs})
	}
	slices.SortFunc(buf, func(a, b headerField) int { return strings.Compare(a.name, b.name) })
	return buf
}

// appendFields appends the encoding of r with its header's fields, sorted.
func (r *Response) appendFields(b []byte, fields []headerField) []byte {
	flags := byte(0)
	if r.Unreplayable {
		flags |= 1
	}
	b = append(b, responseEncodingV1, flags)
	b = binary.AppendUvarint(b, uint64(r.StatusCode))
	b = binary.AppendUvarint(b, uint64(len(fields)))
	for _, f := range fields {
		b = appendField(b, f.name)
		b = binary.AppendUvarint(b, uint64(len(f.values)))
		for _, v := range f.values {
			b = appendField(b, v)
		}
	}
	return appendField(b, r.Body)
}

// EncodedSize returns the length of the response's binary encoding, without
// encoding it.
func (r *Response) EncodedSize() int {
	n := 0
	for name, vs := range r.Header {
		n += fieldSize(name, vs)
	}
	return n + r.encodedSize(nil) + uvarintLen(uint64(len(r.Header))) - 1
}

// encodedSize is the length of the encoding of r with fields.
func (r *Response) encodedSize(fields []headerField) int {
	n := 2 + uvarintLen(uint64(r.StatusCode)) + uvarintLen(uint64(len(fields)))
	for _, f := range fields {
		n += fieldSize(f.name, f.values)
	}
	return n + uvarintLen(uint64(len(r.Body))) + len(r.Body)
}

func fieldSize(name string, vs []string) int {
	n := uvarintLen(uint64(len(name))) + len(name) + uvarintLen(uint64(len(vs)))
	for _, v := range vs {
		n += uvarintLen(uint64(len(v))) + len(v)
	}
	return n
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// UnmarshalBinary decodes a response encoded by MarshalBinary. The body
// aliases data; callers that reuse data must copy it first. The header
// fields' names and values share one string, and their value slices one
// array (each capped, so that an append copies): a decoded response costs
// a few allocations whatever its number of fields, which matters to a
// store that decodes on every replay (memstore).
func (r *Response) UnmarshalBinary(data []byte) error {
	return r.unmarshal(data, nil)
}

// DecodeResponse returns a new Response decoded from data, as
// UnmarshalBinary decodes it. When the header holds at most four values,
// the Response and their slices share one allocation: a store that decodes
// on every replay (memstore) saves one.
func DecodeResponse(data []byte) (*Response, error) {
	d := new(responseWithValues)
	if err := d.r.unmarshal(data, d.values[:]); err != nil {
		return nil, err
	}
	return &d.r, nil
}

type responseWithValues struct {
	r      Response
	values [4]string
}

// unmarshal is UnmarshalBinary, with the header's values in spare if they
// fit.
func (r *Response) unmarshal(data []byte, spare []string) error {
	d := decoder{b: data}
	if d.byte() != responseEncodingV1 {
		return fmt.Errorf("%w: unknown encoding version", errBadResponseEncoding)
	}
	flags := d.byte()
	status := d.uvarint()
	nh := d.uvarint()
	if d.err != nil || nh > uint64(len(data)) {
		return errBadResponseEncoding
	}
	var h http.Header
	if nh > 0 {
		// A first pass checks the fields and counts their values.
		start, total := len(data)-len(d.b), uint64(0)
		for i := uint64(0); i < nh && d.err == nil; i++ {
			d.field()
			nv := d.uvarint()
			if nv > uint64(len(d.b)) {
				return errBadResponseEncoding
			}
			for j := uint64(0); j < nv && d.err == nil; j++ {
				d.field()
			}
			total += nv
		}
		if d.err != nil {
			return errBadResponseEncoding
		}
		// The second pass takes the names and values out of one string.
		fields := data[start : len(data)-len(d.b)]
		text := string(fields)
		t := decoder{b: fields}
		str := func() string {
			n := len(t.field())
			end := len(text) - len(t.b)
			return text[end-n : end]
		}
		h = make(http.Header, nh)
		var values []string
		if total <= uint64(len(spare)) {
			values = spare[:total]
		} else {
			values = make([]string, total)
		}
		for range nh {
			name := str()
			nv := int(t.uvarint())
			vs := values[:nv:nv]
			values = values[nv:]
			for j := range vs {
				vs[j] = str()
			}
			h[name] = vs
		}
	}
	body := d.field()
	if d.err != nil || len(d.b) != 0 || status < 100 || status > 999 {
		return errBadResponseEncoding
	}
	*r = Response{StatusCode: int(status), Header: h, Body: body, Unreplayable: flags&1 != 0}
	return nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.err = errBadResponseEncoding
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errBadResponseEncoding
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) field() []byte {
	n := d.uvarint()
	if d.err != nil || n > uint64(len(d.b)) {
		d.err = errBadResponseEncoding
		return nil
	}
	f := d.b[:n:n]
	d.b = d.b[n:]
	return f
}

// appendField appends a length-prefixed field.
func appendField[T string | []byte](buf []byte, v T) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(v)))
	return append(buf, v...)
}
