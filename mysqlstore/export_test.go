package mysqlstore

// Migrations is the number of embedded migrations: one history row each.
const Migrations = 1
