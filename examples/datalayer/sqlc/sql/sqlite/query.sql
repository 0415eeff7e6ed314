-- name: CreateOrder :one
INSERT INTO orders (item, quantity) VALUES (?, ?) RETURNING id;
