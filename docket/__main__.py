from docket.cli import main

raise SystemExit(main())
