module github.com/deadbolt/deadbolt-go

go 1.19
