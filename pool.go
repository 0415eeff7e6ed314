package idem

import "sync"

// typedPool is a sync.Pool that hands out values of one type.
type typedPool[T any] struct{ p sync.Pool }

func pool[T any](newFunc func() T) *typedPool[T] {
	tp := &typedPool[T]{}
	tp.p.New = func() any { return newFunc() }
	return tp
}

func (tp *typedPool[T]) Get() T  { return tp.p.Get().(T) }
func (tp *typedPool[T]) Put(v T) { tp.p.Put(v) }
