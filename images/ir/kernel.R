# kernelgw: IRkernel as the gateway runs it (start-kernel runs this file with
# the connection file after --args). Two of IRkernel's ways are changed before
# it starts, in its Kernel class's methods (IRkernel's own files stay as Debian
# ships them).
local({
    kernel_methods <- IRkernel:::Kernel$def@refMethods

    # After a failed or interrupted cell, IRkernel answers every request
    # already queued behind it with "aborted" (whatever the request's
    # stop_on_error says), and sends no status for them. The only request that
    # can be queued there is the gateway's end probe, sent right after a failed
    # cell's reply: aborted, its idle never came and the failed cell ended
    # 1.5 s late ("no idle status"). The gateway keeps its own queue and stops
    # a client's later cells on error itself, so the kernel aborts nothing.
    keep_queued <- kernel_methods$abort_queued_messages
    keep_queued@.Data <- function() invisible(NULL)
    assign("abort_queued_messages", keep_queued, envir = kernel_methods)

    # An interrupted cell's reply had status "abort" and no error was shown.
    # It now ends as IPython's does: an error KeyboardInterrupt (shown unless
    # the request was silent) and a reply with status "error", so the gateway
    # says the cell was interrupted rather than failed.
    answered <- new.env()
    answered$msg_id <- ""
    send <- kernel_methods$send_response
    send_fn <- send@.Data
    body(send_fn) <- bquote({
        if (msg_type == "execute_reply") assign("msg_id", parent_msg$header$msg_id, envir = .(answered))
        if (msg_type == "execute_reply" && identical(content$status, "abort")) {
            interrupted <- list(ename = "KeyboardInterrupt", evalue = "", traceback = list("KeyboardInterrupt"))
            if (!isTRUE(parent_msg$content$silent)) {
                send_response("error", parent_msg, "iopub", interrupted)
            }
            content <- c(list(status = "error", execution_count = content$execution_count), interrupted)
        }
        .(body(send_fn))
    })
    send@.Data <- send_fn
    assign("send_response", send, envir = kernel_methods)

    # A SIGINT (the gateway's interrupt) that lands in a cell's request before
    # or after IRkernel's own evaluate (which turns it into an "abort" reply)
    # reached R's top level, which under -f halts R: the kernel died. Such a
    # cell is now answered as interrupted, unless its reply went out already.
    executor_methods <- IRkernel:::Executor$def@refMethods
    execute <- executor_methods$execute
    execute_fn <- execute@.Data
    body(execute_fn) <- bquote({
        tryCatch(.(body(execute_fn)), interrupt = function(cond) {
            if (!identical(get("msg_id", envir = .(answered)), request$header$msg_id)) {
                send_response("execute_reply", request, "shell", list(status = "abort", execution_count = execution_count))
            }
        })
    })
    execute@.Data <- execute_fn
    assign("execute", execute, envir = executor_methods)

    # quit() and q() ended the cell ok and R went on: IRkernel asks the frontend
    # to shut the kernel down (an ask_exit payload), which the gateway, as
    # JupyterLab, does not do. R now ends as it does outside a kernel, with the
    # status given (after .Last, unless runLast = FALSE); the gateway ends the
    # cell dead with that exit code and state_lost, as for Python's os._exit(3).
    real_quit <- base::quit
    quit_method <- executor_methods$quit
    quit_fn <- quit_method@.Data
    body(quit_fn) <- bquote({
        if (identical(save, "ask")) save <- "no"
        .(real_quit)(save = save, status = status, runLast = runLast)
    })
    quit_method@.Data <- quit_fn
    assign("quit", quit_method, envir = executor_methods)

    # One that lands outside any request (after a reply, before the next poll)
    # is dropped: the main loop polls again.
    run <- kernel_methods$run
    run_fn <- run@.Data
    body(run_fn) <- bquote({
        repeat {
            ended <- tryCatch({
                .(body(run_fn))
                TRUE
            }, interrupt = function(e) FALSE)
            if (ended) break
        }
    })
    run@.Data <- run_fn
    assign("run", run, envir = kernel_methods)
})
IRkernel::main()
