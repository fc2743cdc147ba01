-- Nexmark q1: currency conversion. Each bid's price from dollars to euros.
SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM STREAM bid;
