// Package schema is the ent schema of the orders table; ent generates the
// package above it from this one.
package schema

import (
	"entgo.io/ent"
	"entgo.io/ent/schema/field"
)

// Order is one order (table "orders").
type Order struct {
	ent.Schema
}

// Fields of Order; ent adds the integer id.
func (Order) Fields() []ent.Field {
	return []ent.Field{
		field.String("item").NotEmpty(),
		field.Int("quantity").Positive(),
	}
}
