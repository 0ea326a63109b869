module docket.dev/verify-go

go 1.19
